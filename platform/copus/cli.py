"""`copus` command line: every command loads the experiment YAML through the same typed config.

Exit codes: 0 success, 2 bad input (config, dataset, output dir), 1 training failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from copus.config import ConfigError, ExperimentConfig, is_suite_file, load_config
from copus.storage import Location, StorageError, read_lines


def _add_overrides(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.SUB=VALUE", help=help)


def _add_experiment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", help="experiment YAML file")
    _add_overrides(p, "override a config field, e.g. --set batch.gbs=32 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="copus", description="Goodput-driven co-adaptive batch size and 3D parallelism on Ray"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_training_commands(sub)
    _add_analysis_commands(sub)
    _add_data_commands(sub)
    return parser


def _add_training_commands(sub) -> None:
    """validate, run, gns, cluster, compare."""
    p = sub.add_parser("validate", help="check an experiment YAML and print the resolved config")
    _add_experiment_args(p)
    p.add_argument("--json", action="store_true", help="print the resolved config as JSON")
    p = sub.add_parser("run", help="train an experiment on Ray Train, logging to MLflow")
    _add_experiment_args(p)
    p.add_argument("--fresh", action="store_true", help="discard checkpoints in output_dir and start over")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout at the end (progress on stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress lines; the summary only")
    p = sub.add_parser("gns", help="measure the gradient noise scale at the experiment's initial weights (JSON)")
    _add_experiment_args(p)
    p.add_argument("--steps", type=int, default=50, help="global batches to measure over (default 50)")
    p = sub.add_parser(
        "cluster", help="bring an emulated multi-node cluster up or down on this machine (root; cluster.emulate)"
    )
    p.add_argument("action", choices=("up", "down", "status", "reshape"))
    p.add_argument("experiment", nargs="?", help="with up: the experiment YAML whose cluster.emulate to bring up")
    _add_overrides(p, "override a field of the experiment, e.g. --set cluster.emulate.link_mbit=200")
    p.add_argument("--state-dir", help="with down/status: the cluster's state directory (default /tmp/copus-emu)")
    p.add_argument("--json", action="store_true", help="with status: print the state as JSON")
    p.add_argument("--link-mbit", type=float, help="with reshape: the new inter-node rate, Mbit/s each direction")
    p = sub.add_parser("compare", help="run one experiment under several policies; time to target and speedup")
    p.add_argument("suite", help="comparison suite YAML")
    _add_overrides(p, "override a field of the suite's experiment (repeatable)")
    p.add_argument(
        "--json", action="store_true", help="print comparison.json to stdout at the end (progress on stderr)"
    )
    p.add_argument("--quiet", action="store_true", help="print only the final table")
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on with the suite in its output_dir: keep its tuning choice and complete repeats, run the rest",
    )
    p.add_argument(
        "--tune-only",
        action="store_true",
        help="run the tuning phase, write its choice to comparison.json and stop (--resume evaluates later)",
    )


def _add_analysis_commands(sub) -> None:
    """report, simulate, calibrate, profile."""
    p = sub.add_parser(
        "report", help="a self-contained HTML report of a comparison or a run (from MLflow), or of a calibration file"
    )
    p.add_argument(
        "source",
        help="an output directory of copus compare or copus run, an MLflow run id, or a "
        "calibration-<id>.json of copus calibrate",
    )
    p.add_argument(
        "--out",
        help="where to write the HTML (default: SOURCE/report.html, dashboards/report-RUN.html, or "
        "<calibration stem>-report.html beside the file)",
    )
    p.add_argument(
        "--tracking-uri", help="MLflow tracking URI when SOURCE is a run id (default sqlite:///$PWD/mlflow.db)"
    )
    p = sub.add_parser("simulate", help="every policy on a modelled GPU cluster: time to target, speedup, best layouts")
    p.add_argument("simulation", help="simulation YAML (e.g. experiments/sim/paper_llama-2-13b_2x8-h100.yaml)")
    _add_overrides(p, "override a field, e.g. --set training.target_loss=2.4 (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--suite",
        metavar="SUITE_YAML",
        help="predict this comparison suite's runs instead (its policies over its evaluation seeds, its tuning candidates)",
    )
    p.add_argument(
        "--measured",
        metavar="COMPARISON_JSON",
        help="with --suite: set the prediction against the suite as measured (its comparison.json)",
    )
    p = sub.add_parser(
        "calibrate",
        help="measure the critical batch: branch a reference run, sweep the GBS from each branch point, fit (Ray Tune)",
    )
    p.add_argument(
        "experiment",
        help="experiment YAML, or a comparison suite YAML (calibrates its experiment where "
        "the suite's runs look for it)",
    )
    _add_overrides(p, "override a field of the experiment (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--reuse-points",
        metavar="FILE",
        help="take over the continuations of this calibration file (same model, optimiser, schedule and "
        "settings; another noise estimator or machine): only the reference run is repeated",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="2 seeds at 2 of the branch points, a quarter of a default calibration's continuations "
        "(docs/calibration.md); --set wins over it",
    )
    p = sub.add_parser("profile", help="measure step times of the search space, fit and check the step-time model")
    _add_experiment_args(p)
    p.add_argument("--refresh", action="store_true", help="measure again instead of reusing the stored profile table")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _add_data_commands(sub) -> None:
    """prepare, export."""
    p = sub.add_parser("prepare", help="tokenize the experiment's dataset into token files, on all cores (restartable)")
    _add_experiment_args(p)
    p.add_argument("--workers", type=int, default=None, help="tokenizing processes (default: every core)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p = sub.add_parser("export", help="write a run's newest committed checkpoint as a Hugging Face model directory")
    p.add_argument("output_dir", help="the run's output_dir")
    p.add_argument("out", help="the Hugging Face model directory to write (must not exist, or be empty)")


def _cmd_validate(cfg: ExperimentConfig, args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(cfg.model_dump(mode="json"), indent=2))
    else:
        p, b, ramp = cfg.parallel, cfg.batch, cfg.batch_ramp()
        print(
            f"{args.experiment}: valid. {cfg.workload.model} seq {cfg.workload.seq_len}, layout dp{p.dp} tp{p.tp} pp{p.pp}"
            f"{cfg.start_config().knobs_label()} "
            f"on {cfg.cluster.num_workers} {'GPU' if cfg.cluster.use_gpu else 'CPU'} workers, gbs {b.gbs} "
            f"(mbs {b.mbs} x {cfg.microbatches_per_replica} micro-batches x dp {p.dp}), policy {cfg.policy.name}"
            f"{f' ({ramp.describe()})' if ramp is not None else ''}, "
            f"output {cfg.resolved_output_dir()}"
        )
    return 0


def _cmd_validate_suite(args: argparse.Namespace) -> int:
    """`copus validate SUITE.yaml`: the suite and its experiment, as `copus compare` reads them."""
    from copus.config import config_from_mapping, load_suite, tuning_candidates

    suite, experiment = load_suite(args.experiment, args.overrides)
    cfg = config_from_mapping(experiment, suite.set + args.overrides)
    if args.json:
        print(json.dumps({"suite": suite.model_dump(mode="json"), "experiment": cfg.model_dump(mode="json")}, indent=2))
        return 0
    seeds = f"evaluation seeds {suite.evaluation_seeds}" if suite.evaluation_seeds else f"seeds {suite.seeds}"
    print(
        f"{args.experiment}: valid comparison suite. {', '.join(suite.policies)} x {suite.evaluation_repeats} "
        f"repeat(s) ({seeds}) of {cfg.name}: {cfg.workload.model} seq {cfg.workload.seq_len}, "
        f"gbs {cfg.batch.gbs}, output {suite.output_dir}"
    )
    if suite.tune is not None:
        names = [c.name for c in tuning_candidates(suite, cfg)]
        print(f"tuning first on seeds {suite.tuning_seeds}: {', '.join(names)} (the winners run as tuned baselines)")
    return 0


def _cmd_run(cfg: ExperimentConfig, args: argparse.Namespace) -> int:
    from copus.cluster.driver import run_experiment  # imports ray: only for commands that need it
    from copus.cluster.launch import MonitorLost
    from copus.cluster.progress import summary_text
    from workloads.corpus import DatasetError

    try:
        with _json_stdout(args) as print_json:
            summary = run_experiment(cfg, fresh=args.fresh, echo=_echo(args))
            if args.json:  # stdout is the JSON alone
                print_json(summary, indent=2)
                return 0
    except (ConfigError, DatasetError) as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    except MonitorLost as err:  # the run's state and checkpoints stay: the same command resumes it
        print(f"copus: {err} (the same command resumes it from its newest checkpoint)", file=sys.stderr)
        return 1
    if args.quiet:
        print(summary_text(summary))
    print(f"summary: {summary['output_dir'].partition('?')[0]}/summary.json")
    print(f"MLflow: {summary['mlflow_tracking_uri']} (run {summary['mlflow_run_id']})")
    _print_ui_hint(summary["mlflow_tracking_uri"], summary["mlflow_experiment_id"])
    return 0


def _print_ui_hint(uri: str, experiment_id: str, view_key: str | None = None) -> None:
    """How to see the runs in the MLflow UI, in a shared view whose columns are the results
    (time to target, speedup, final configuration)."""
    from copus.tracking import RESULTS_VIEW_KEY, ui_runs_url

    key = view_key or RESULTS_VIEW_KEY
    if uri.startswith(("http://", "https://")):
        print(f"  open the UI at {ui_runs_url(uri, experiment_id, key)}")
    else:
        print(f"  open the UI with: .venv/bin/mlflow ui --host 127.0.0.1 --backend-store-uri {uri}")
        print(f"  then: {ui_runs_url('http://127.0.0.1:5000', experiment_id, key)}")


def _cmd_gns(cfg: ExperimentConfig, args: argparse.Namespace) -> int:
    from copus.cluster.gns_command import measure_experiment_gns
    from workloads.corpus import DatasetError

    if args.steps < 1:
        print("copus: --steps: must be at least 1", file=sys.stderr)
        return 2
    if cfg.parallel.dp == 1 and cfg.microbatches_per_replica < 2:
        print(
            f"copus: batch.gbs: {cfg.batch.gbs} with parallel.dp 1 and batch.mbs {cfg.batch.mbs} gives one batch "
            "size only; the GNS needs dp > 1 or at least 2 micro-batches",
            file=sys.stderr,
        )
        return 2
    try:
        with _json_stdout(args, always=True) as print_json:
            print_json(measure_experiment_gns(cfg, args.steps))
    except (ConfigError, DatasetError) as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    return 0


def _cmd_profile(cfg: ExperimentConfig, args: argparse.Namespace) -> int:
    from copus.cluster.profile_table import ProfileTableError
    from copus.cluster.profiler import run_profile
    from workloads.corpus import DatasetError

    try:
        with _json_stdout(args) as print_json:
            result = run_profile(cfg, refresh=args.refresh, echo=_echo(args))
            if args.json:
                print_json(result)
    except (ConfigError, DatasetError, ProfileTableError) as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    return 0


def _cmd_prepare(cfg: ExperimentConfig, args: argparse.Namespace) -> int:
    from copus.prepare import prepare_experiment_data
    from workloads.corpus import DatasetError

    if args.workers is not None and args.workers < 1:
        print("copus: --workers: must be at least 1", file=sys.stderr)
        return 2
    try:
        result = prepare_experiment_data(cfg, args.workers, progress=not (args.quiet or args.json))
    except DatasetError as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else result["line"])
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from copus.train.export import ExportError, export_run

    try:
        result = export_run(args.output_dir, args.out)
    except ExportError as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    print(f"exported step {result['step']} ({result['tensors']} tensors, {result['files']} files) to {result['out']}")
    for refused in result["refused"]:  # newer checkpoints passed over: say which, and why
        print(f"  newer checkpoint refused: {refused['checkpoint']} ({refused['reason']})")
    return 0


COMMANDS = {
    "validate": _cmd_validate,
    "run": _cmd_run,
    "gns": _cmd_gns,
    "profile": _cmd_profile,
    "prepare": _cmd_prepare,
}


def _json_stdout(args: argparse.Namespace, always: bool = False) -> contextlib.AbstractContextManager:
    """For a command whose stdout is one JSON document (with --json, or `always`): a context that
    yields the function printing that document; anything else printed meanwhile goes to stderr."""
    if always or getattr(args, "json", False):
        return _stdout_to_stderr(keep=getattr(args, "process_entry", False))
    return contextlib.nullcontext(_print_json)


def _print_json(doc, indent: int | None = None, file=None) -> None:
    print(json.dumps(doc, indent=indent), file=file or sys.stdout, flush=True)


def _stdout_descriptor_is_1() -> bool:
    try:
        return sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is a ValueError and an OSError
        return False


@contextlib.contextmanager
def _stdout_to_stderr(keep: bool):
    """File descriptor 1 points at stderr, which catches what redirecting sys.stdout alone does not:
    Ray's C++ core writing to it, and Ray's log thread relaying a raylet's lines (a state dump) to
    the driver, which can come after the command is done. So a `copus` process (`keep`) leaves it
    there until it exits; the document goes to the real stdout through a descriptor of its own.
    Called in a process whose sys.stdout is not descriptor 1 (a test capturing it), the document
    goes to that sys.stdout."""
    real = sys.stdout
    real.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    document_out = os.fdopen(os.dup(saved), "w") if _stdout_descriptor_is_1() else real
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield lambda doc, indent=None: _print_json(doc, indent, document_out)
    finally:
        sys.stderr.flush()
        if document_out is not real:
            document_out.close()
        if not keep:
            os.dup2(saved, 1)
        os.close(saved)


def _echo(args: argparse.Namespace):
    if getattr(args, "quiet", False):
        return lambda line: None
    if getattr(args, "json", False):
        return lambda line: print(line, file=sys.stderr)
    return print


def _cmd_compare(args: argparse.Namespace) -> int:
    from copus.config import load_suite

    try:
        suite, experiment = load_suite(args.suite, args.overrides)
    except ConfigError as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    from copus.cluster.compare import comparison_table, run_comparison
    from workloads.corpus import DatasetError

    try:
        with _json_stdout(args) as print_json:
            result = run_comparison(
                suite, experiment, args.overrides, _echo(args), resume=args.resume, tune_only=args.tune_only
            )
            if args.json:
                print_json(result, indent=2)
            if args.json or args.tune_only:  # a tuning phase alone has no table to print
                return 0
    except (ConfigError, DatasetError) as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    if args.quiet:
        print(comparison_table(result))
    _print_ui_hint(result["mlflow_tracking_uri"], result["mlflow_experiment_id"], result["mlflow_view_key"])
    return 0


# Commands that also take a comparison suite: they work on its experiment, in the suite's
# profile directory (where the suite's runs look for the profile table and the calibration).
SUITE_AWARE = ("profile", "calibrate")


def experiment_config(args: argparse.Namespace) -> ExperimentConfig:
    """The experiment to profile or calibrate: the file itself, or a suite's experiment with the
    suite's profile directory."""
    from copus.config import config_from_mapping, is_suite_file, load_suite

    if not is_suite_file(args.experiment):
        return load_config(args.experiment, args.overrides)
    from copus.cluster.compare import suite_table_dir

    suite, experiment = load_suite(args.experiment, args.overrides)
    base = config_from_mapping(experiment, suite.set + args.overrides)
    return config_from_mapping(
        experiment, suite.set + args.overrides + [f"profile.table_dir={suite_table_dir(suite, base)}"]
    )


def calibrate_config(args: argparse.Namespace) -> ExperimentConfig:
    """The experiment `copus calibrate` measures: with --quick, the quick mode's settings over
    the experiment's, and the user's own --set over both."""
    cfg = experiment_config(args)
    if not getattr(args, "quick", False):
        return cfg
    from copus.cluster.calibrate import quick_overrides  # imports ray

    return experiment_config(argparse.Namespace(**{**vars(args), "overrides": quick_overrides(cfg) + args.overrides}))


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from workloads.corpus import DatasetError

    try:
        cfg = calibrate_config(args)
        from copus.cluster.calibrate import calibration_table, run_calibration  # imports ray

        with _json_stdout(args) as print_json:
            result = run_calibration(cfg, _echo(args), args.reuse_points)
            if args.json:
                print_json(result, indent=2)
                return 0
    except (ConfigError, DatasetError) as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    print(calibration_table(result))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from dashboards.data import ReportError
    from dashboards.report import build_report

    try:
        path = build_report(args.source, args.out, args.tracking_uri)
    except (ReportError, StorageError) as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from copus.config import load_suite
    from copus.sim.config import load_sim_config
    from copus.sim.run import run_simulation, simulation_text
    from copus.sim.suite import check_prediction, check_text, predict_suite, read_comparison, suite_text

    try:
        if args.measured and not args.suite:
            raise ConfigError("--measured: needs --suite (the suite the comparison.json is of)")
        cfg = load_sim_config(args.simulation, args.overrides)
        if args.suite:
            suite, experiment = load_suite(args.suite)
            gbs = (experiment.get("batch") or {}).get("gbs", cfg.batch.gbs)
            result, text = predict_suite(cfg, suite, gbs), suite_text
            if args.measured:
                check = check_prediction(result, read_comparison(args.measured, suite.name))
                result["measured"] = check
                text = lambda r: suite_text(r) + "\n" + check_text(r["measured"])  # noqa: E731
        else:
            result, text = run_simulation(cfg), simulation_text
    except (ConfigError, ValueError) as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else text(result))
    return 0


def _last_checkpoint_step(out: Location) -> int | None:
    """The step of the last checkpoint a run's records mention (None before the first)."""
    step = None
    try:
        for line in read_lines(out / "records.jsonl"):
            if '"kind": "checkpoint"' in line:
                step = json.loads(line).get("step", step)
    except (OSError, ValueError):
        pass
    return step


def _interrupted(args: argparse.Namespace) -> str:
    """One line saying where Ctrl-C stopped, what is kept and how to go on."""
    try:
        return _where_interrupted(args)
    except (ConfigError, StorageError):  # the config, or a location it names, no longer opens
        return "interrupted"


def _where_interrupted(args: argparse.Namespace) -> str:
    if args.command == "cluster":
        return "interrupted; `copus cluster down` removes whatever was left"
    if args.command == "compare":
        from copus.config import load_suite

        out = Location.parse(load_suite(args.suite, args.overrides)[0].output_dir)
        return (
            f"interrupted; the finished runs are in {out / 'comparison.json'} and {out}/<policy>/r<repeat>, "
            f"the profile table in {out / 'profiles'} is reused: run the same command to start the suite again"
        )
    cfg = experiment_config(args) if args.command in SUITE_AWARE else load_config(args.experiment, args.overrides)
    if args.command == "calibrate":
        return (
            f"interrupted; the branch points and every finished continuation are kept in "
            f"{cfg.resolved_profile_dir()}/calibration-<id>/: run the same command to go on with the rest"
        )
    if args.command == "profile":
        return (
            f"interrupted; every configuration measured so far is kept in the profile table in "
            f"{cfg.resolved_profile_dir()}: run the same command to measure the rest"
        )
    out = cfg.resolved_output_dir()
    step = _last_checkpoint_step(out)
    kept = f"the checkpoint of step {step} is kept in {out}" if step is not None else f"no checkpoint yet in {out}"
    return f"interrupted; {kept}: run the same command to resume (--fresh starts over)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Called as the `copus` command (not from Python with arguments): a --json command's stdout
    # stays on stderr until the process exits, so late output cannot follow its document.
    args.process_entry = argv is None
    from copus.cluster.emulate import EmulationError  # no ray: plain processes and `ip`

    try:
        with _emulated_cluster_for(args):
            return _dispatch(args)
    except EmulationError as err:
        print(f"copus: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"copus: {_interrupted(args)}", file=sys.stderr)
        return 130


# Commands that train or measure on Ray: under cluster.emulate they run on the emulated cluster.
RAY_COMMANDS = ("run", "gns", "profile", "compare", "calibrate")


def _ray_experiment(args: argparse.Namespace) -> ExperimentConfig:
    """The experiment a Ray command works on (a suite's, for compare)."""
    from copus.config import config_from_mapping, load_suite

    if args.command == "compare":
        suite, experiment = load_suite(args.suite, args.overrides)
        return config_from_mapping(experiment, suite.set + args.overrides)
    if args.command in SUITE_AWARE:
        return experiment_config(args)
    return load_config(args.experiment, args.overrides)


def _emulated_cluster_for(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """For a Ray command whose experiment has cluster.emulate (and names no other cluster): the
    emulated cluster that is up, or one brought up for this command and taken down after it."""
    if args.command not in RAY_COMMANDS:
        return contextlib.nullcontext()
    try:
        cfg = _ray_experiment(args)
    except ConfigError:  # the command itself reports it, with its exit code
        return contextlib.nullcontext()
    cluster = cfg.cluster
    if cluster.emulate is None or cluster.address or os.environ.get("RAY_ADDRESS"):
        return contextlib.nullcontext()
    from copus.cluster.emulate import EmulatedSpec, emulated_cluster

    return emulated_cluster(EmulatedSpec.from_config(cfg), lambda line: print(line, file=sys.stderr))


def _cmd_cluster(args: argparse.Namespace) -> int:
    """`copus cluster up EXPERIMENT | down | status`: the emulated multi-node cluster."""
    from copus.cluster import emulate

    if args.action == "up":
        if args.experiment is None:
            print("copus: cluster up: name the experiment YAML whose cluster.emulate to bring up", file=sys.stderr)
            return 2
        cfg = load_config(args.experiment, args.overrides)
        if cfg.cluster.emulate is None:
            print(f"copus: {args.experiment}: cluster.emulate: not set, nothing to emulate", file=sys.stderr)
            return 2
        state = emulate.up(emulate.EmulatedSpec.from_config(cfg))
        exports = " ".join(f"{k}={v}" for k, v in {**state["env"], "RAY_ADDRESS": state["address"]}.items())
        print(f"join it:  export {exports}")
        print(f"jobs API: ray job submit --address {state['dashboard']} --working-dir . -- COMMAND")
        return 0
    state_dir = args.state_dir or _default_state_dir()
    if args.action == "down":
        problem = emulate.requirements_problem()
        if problem:
            raise emulate.EmulationError(problem)
        emulate.down(state_dir)
        return 0
    if args.action == "reshape":
        if args.link_mbit is None or args.link_mbit <= 0:
            print("copus: cluster reshape: --link-mbit: a positive rate is required", file=sys.stderr)
            return 2
        state = emulate.reshape(state_dir, args.link_mbit)
        print(f"links re-capped at {args.link_mbit:g} Mbit/s: {emulate.EmulatedSpec(**state['spec']).describe()}")
        return 0
    state = emulate.status(state_dir)
    if args.json:
        print(json.dumps(state, indent=2))
    elif state is None:
        print(f"no emulated cluster is up (state in {state_dir})")
    else:
        health = "healthy" if state["healthy"] else "NOT healthy (`copus cluster down`, then up again)"
        print(f"{emulate.EmulatedSpec(**state['spec']).describe()}, head {state['address']}: {health}")
    return 0 if state is None or state["healthy"] else 1


def _default_state_dir() -> str:
    from copus.config import EmulateConfig

    return EmulateConfig.model_fields["state_dir"].default


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "cluster":
        return _cmd_cluster(args)
    if args.command == "export":
        return _cmd_export(args)
    if args.command == "compare":
        return _cmd_compare(args)
    if args.command == "simulate":
        return _cmd_simulate(args)
    if args.command == "report":
        return _cmd_report(args)
    if args.command == "calibrate":
        return _cmd_calibrate(args)
    try:
        if args.command == "validate" and is_suite_file(args.experiment):
            return _cmd_validate_suite(args)
        cfg = experiment_config(args) if args.command in SUITE_AWARE else load_config(args.experiment, args.overrides)
        return COMMANDS[args.command](cfg, args)
    except ConfigError as err:  # a location the config names that cannot be opened, found while working
        print(f"copus: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
