"""The machinery that starts rank processes and talks to them; a learner never imports it.

The kernel's side is `group.RankGroup` (start ranks, run tasks, collect output, report failures
and hangs, clean up), one `proc.RankProcess` per rank; the rank's side is `rank.rank_main`; every
message between them is in `protocol`. How rank processes come into being: `start_path` chooses
one of two paths, which both implement `starter.Starter`:

* ``"forkserver"`` (`forkserver`, its server side `forkserver_main`): a warm helper process that
  has imported torch forks each rank in milliseconds (Linux; macOS under `forksafety`'s rules).
* ``"spawn"`` (`spawn`, macOS's default, or when asked for): each rank is a fresh interpreter,
  taken from a pool of spares that have imported torch while the learner read.

`group.RankGroup` only talks to a `starter.Starter`, so the rest of distlab behaves the same
whichever path started the ranks.
"""
