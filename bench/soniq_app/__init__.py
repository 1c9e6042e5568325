"""The benchmark's jobs for soniq_django (found by the app's ``jobs`` autodiscovery)."""
