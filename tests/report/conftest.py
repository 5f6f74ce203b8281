"""Report fixtures: the trainer's toy dataset, for reporting a real (tiny) training run."""

from tests.train.conftest import toy_problems  # noqa: F401 (a fixture, used by name)
