"""Where a resumed run trains: the configuration it reached, or, when the cluster changed size,
the experiment's start for the new size (the checkpoint reshards across world sizes; the
restart path is the one for a change of world size)."""

from __future__ import annotations

from copus.cluster.run_state import resume_config
from copus.core.layout import CandidateConfig


def test_a_resumed_run_keeps_the_configuration_it_reached():
    start = CandidateConfig(4, 1, 1, 2, 16)
    assert resume_config(None, start) == (start, None)
    reached = CandidateConfig(2, 1, 2, 4, 32)
    assert resume_config(reached.__dict__, start) == (reached, None)


def test_a_cluster_of_another_size_resumes_in_the_start_configuration_for_it():
    start = CandidateConfig(8, 1, 1, 2, 16)
    config, line = resume_config(CandidateConfig(2, 1, 2, 4, 32).__dict__, start)
    assert config == start
    assert (
        line == "the cluster has 8 workers now, 4 before: resuming from the last checkpoint in dp8-tp1-pp1 mbs2 gbs16"
    )
