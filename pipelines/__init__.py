"""The Prefect flow, its stage entry points and the `bertflow` command line."""
