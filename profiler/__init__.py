"""profiler subpackage of specdec_tune."""
