"""Monitor: the gRPC service, metric storage, detectors and the command channel to ranks."""
