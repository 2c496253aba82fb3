"""The pipeline machinery: preparing a study from its config, scheduling (applicability, sweep points, collected outputs), running a job (runner), live runs and the cluster's resources."""
