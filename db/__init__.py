"""db subpackage of specdec_tune."""
