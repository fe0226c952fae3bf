"""engine subpackage of specdec_tune."""
