"""What a run's Goodput controller is built from: the profile table (profiled first when there
is none) and its step-time model, the memory-feasible search space, the workload's calibration
when one exists, and the policy's starting configuration."""

from __future__ import annotations

from typing import Callable

from copus.cluster.calibrate import calibration_path, load_calibration
from copus.cluster.controller import ControllerSpec
from copus.cluster.profiler import feasible_space, load_or_profile, predicted_throughputs
from copus.config import ExperimentConfig
from copus.core.decision_rule import DEFAULT_TRANSIENT_STEPS, step_time_log_sd, transient_steps_from_calibration
from copus.core.layout import CandidateConfig
from copus.core.planner import RuleSettings
from copus.core.policies import initial_config
from copus.core.probing import ProbeSettings

GOODPUT_POLICIES = ("copus", "copus-gbs")  # the policies that plan by goodput: they may probe


def setup_controller(
    cfg: ExperimentConfig,
    echo: Callable[[str], None],
    b_noise_script: tuple | None = None,
    data_fingerprint: str | None = None,
) -> tuple[ControllerSpec, CandidateConfig]:
    """The controller's inputs (profile table → step-time model, memory-feasible search
    space, the workload's calibration when one exists) and the policy's starting
    configuration. Profiles first when no table exists. B0 of the efficiency and of the noise
    scale is optimizer.reference_gbs, the GBS the base LR is right for."""
    table, model = load_or_profile(cfg, echo)
    known = data_fingerprint is not None and cfg.calibration.use
    calibration = load_calibration(cfg, data_fingerprint) if known else None
    spec = controller_spec(cfg, table, model, calibration, b_noise_script)
    echo(
        f"profile: {len(table.measured())} configurations measured in {cfg.resolved_profile_dir()}; the controller "
        f"chooses among {len(spec.throughputs)} memory-feasible ones"
    )
    if calibration is not None:
        levels = ", ".join(f"{_fmt(b['b_crit'])} at val loss {b['val_loss']:.2f}" for b in calibration["branch_points"])
        echo(
            f"efficiency from the calibration {calibration_path(cfg, data_fingerprint).name} (measured critical "
            f"batch {levels})"
        )
    return spec, initial_config(cfg.policy.name, spec.planner(), cfg.start_config(), cfg.policy.layout)


def controller_spec(
    cfg: ExperimentConfig, table, model, calibration: dict | None, b_noise_script: tuple | None = None
) -> ControllerSpec:
    """The controller's inputs from the experiment, its profile table and step-time model, and
    the workload's calibration (or None): what a run's controller gets, and what a replay of its
    records (copus.cluster.replay) rebuilds it from."""
    throughputs = predicted_throughputs(table, model, feasible_space(cfg, table))
    return ControllerSpec(
        policy=cfg.policy.name,
        throughputs=tuple(throughputs.items()),
        model_throughputs=tuple((c, model.throughput(c)) for c in throughputs) if model is not None else None,
        b0=cfg.optimizer.reference_gbs,
        efficiency=cfg.policy.efficiency,
        critical_factor=cfg.gns.critical_factor,
        threshold=cfg.policy.threshold,
        interval_s=cfg.policy.interval_s,
        restart_cost_s=cfg.policy.restart_cost_s,
        in_place_cost_s=first_in_place_cost_s(cfg, table),
        reconfigure=cfg.reconfigure,
        b_noise_script=b_noise_script,
        calibration=calibration,
        probes=probe_settings(cfg, calibration is not None),
        rule=rule_settings(cfg, table, model, list(throughputs), calibration),
        target_loss=cfg.stop.target_val_loss,
        factor_log_sd=cfg.policy.probes.prior_sd,
    )


# An in-place layout change's cost when neither the experiment nor its profile says (a guess: the
# paper's clusters took 30-56 s; the emulated CPU cluster 0.5-0.9 s)
DEFAULT_IN_PLACE_COST_S = 5.0


def first_in_place_cost_s(cfg: ExperimentConfig, table) -> float:
    """What the planner charges an in-place layout change until the run has measured one:
    `policy.in_place_cost_s` where the experiment sets it, else what the profile's own in-place
    changes between its layouts took, else `DEFAULT_IN_PLACE_COST_S`."""
    if cfg.policy.in_place_cost_s is not None:
        return cfg.policy.in_place_cost_s
    measured = table.in_place_reshard_s()
    return measured if measured is not None else DEFAULT_IN_PLACE_COST_S


def probe_settings(cfg: ExperimentConfig, calibrated: bool) -> ProbeSettings | None:
    """`policy.probes` as the controller's settings, or None where the controller does not
    probe: a policy that does not plan by goodput, probes off, or auto with a calibration (it
    measured c per progress level, with more seeds than a probe has)."""
    p = cfg.policy.probes
    if cfg.policy.name not in GOODPUT_POLICIES or p.enabled is False or (p.enabled == "auto" and calibrated):
        return None
    first = p.first_samples if p.first_samples is not None else cfg.schedule.warmup_samples
    return ProbeSettings(**p.model_dump(exclude={"enabled", "first_samples"}), first_samples=first)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def rule_settings(cfg: ExperimentConfig, table, model, space: list[CandidateConfig], calibration: dict | None):
    """The planner's switching rule (copus.core.planner): the configured rule and quantile, each
    candidate's step-time uncertainty from the profile model's held-out error
    (copus.core.decision_rule), and the transient's steps as configured, else as the calibration
    measured them, else the default."""
    error = (getattr(table, "model", None) or {}).get("error") or {}
    sds = None
    if "mape" in error:
        extrapolates = [model.extrapolates(c) for c in space]
        sds = dict(zip(space, step_time_log_sd(error["mape"], error.get("max_ape", error["mape"]), extrapolates)))
    p = cfg.policy
    transient = p.transient_steps
    if transient is None:
        transient = transient_steps_from_calibration(calibration)
    return RuleSettings(
        p.decision_rule,
        p.gain_quantile_z,
        p.gain_floor,
        DEFAULT_TRANSIENT_STEPS if transient is None else transient,
        sds,
        p.horizon_points,
        p.read_run_speed,
        p.profile_point_sd,
        p.run_speed_band,
        p.run_speed_reading,
    )
