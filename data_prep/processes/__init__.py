"""How data preparation runs its work: forked helpers that share the parent's memory
(`forked`), children that die with their parent (`tethered_child`, `worker_lifetime`),
temporary files that never pass for output (`temporaries`), and the test-only pause points
that hold a run at a chosen moment (`pause_point`)."""
