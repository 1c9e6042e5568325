"""The peers' side of the benchmark; runs in bench/.venv-peers only."""
