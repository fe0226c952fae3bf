"""dashboard subpackage of specdec_tune."""
