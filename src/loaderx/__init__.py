"""loaderx: feed ML training from local disk."""
