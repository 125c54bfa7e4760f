"""The Kubernetes backend: the same ClusterBackend as the emulator, on real pods."""
