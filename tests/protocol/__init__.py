"""Model-based (stateful) tests of the owned claim protocol."""
