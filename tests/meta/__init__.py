"""Meta-tests: the suite's own checks and tolerances, shown to fail just past their bounds and pass inside."""
