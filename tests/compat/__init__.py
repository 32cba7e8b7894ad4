"""The compatibility matrix: the wheel of `make dist` on each supported Spark line (`make test-compat`)."""
