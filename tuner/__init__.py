"""tuner subpackage of specdec_tune."""
