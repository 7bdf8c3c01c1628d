"""``%gpuwatch``: IPython glue over :mod:`gpumagic.monitor`."""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class, output_can_be_silenced

from gpumagic.magics.args import MagicParser, without_silencer
from gpumagic.render.html import Note

PARSER = MagicParser(
    "%gpuwatch",
    description="Live inline chart of GPU utilisation, memory, temperature and power (host CPU/RAM "
    "without a GPU); with --prometheus, every GPU of a multi-node job from its DCGM exporters.",
)
PARSER.add_argument("action", nargs="?", default="start", choices=["start", "stop", "status"])
PARSER.add_argument(
    "-i",
    "--interval",
    type=float,
    default=None,
    metavar="SECONDS",
    help="seconds between samples (floor 0.1; default 1, or 5 with --prometheus)",
)
PARSER.add_argument(
    "--log", metavar="FILE.csv", help="append every sample to this CSV (nvidia-smi column names)"
)
PARSER.add_argument("--gpus", metavar="0,1", help="CUDA indexes to watch (default: all visible)")
PARSER.add_argument(
    "--window", type=float, default=300.0, metavar="SECONDS", help="history kept and drawn"
)
PARSER.add_argument("-o", "--output", metavar="VAR", help="stop: also store the result in VAR")
PARSER.add_argument(
    "--price",
    metavar="DOLLARS_PER_HOUR",
    help="what the instance costs per hour: a cost_usd on every cell, the total and the idle "
    "share; with --prometheus, dollars per GPU-hour, times the job's GPUs",
)
PARSER.add_argument(
    "--idle-alert",
    metavar="DURATION",
    help="alert when every GPU has been idle this long (30m, 2h, 90 = seconds) while this "
    "kernel holds GPU memory; without a GPU, while no cell runs",
)
PARSER.add_argument(
    "--prometheus",
    metavar="URL",
    help="watch a job's GPUs on every node: the DCGM exporter series this Prometheus holds "
    "(http://prometheus:9090)",
)
PARSER.add_argument(
    "--selector",
    metavar="LABELS",
    help='with --prometheus, PromQL label matchers picking the job\'s GPUs: Hostname=~"node-[0-3]"',
)
PARSER.add_argument(
    "--serve",
    metavar="[HOST:]PORT",
    help="also serve this kernel's samples for Prometheus at http://HOST:PORT/metrics (DCGM "
    "names for GPU series; HOST defaults to 127.0.0.1, 0.0.0.0 lets other machines scrape)",
)


def _stop_running_watcher() -> None:
    """Stop the watcher, if one runs, without importing the monitor to find out.

    ``gpumagic.monitor`` imports numpy (about 90 ms of the ~110 ms ``%load_ext gpumagic``
    took when this cleanup imported it at load time); a watcher can only be running once
    its module has been imported, so an absent module means there is nothing to stop.
    """
    watcher = sys.modules.get("gpumagic.monitor.watcher")
    if watcher is not None:
        watcher.stop_current()


@magics_class
class WatchMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        from gpumagic.magics import on_unload

        # %unload_ext stops the sampler thread and unregisters the cell events
        on_unload(_stop_running_watcher)

    @output_can_be_silenced
    @line_magic
    def gpuwatch(self, line: str) -> Any:
        """Watch the GPUs while you work: a live chart that keeps updating while other cells run.

        %gpuwatch [start] [-i SECONDS] [--log FILE.csv] [--gpus 0,1] [--window SECONDS]
                  [--price DOLLARS_PER_HOUR] [--idle-alert DURATION] [--serve [HOST:]PORT]
        %gpuwatch --prometheus URL [--selector LABELS] [--price DOLLARS_PER_GPU_HOUR]
                  [-i SECONDS] [--log FILE.csv] [--window SECONDS]
        %gpuwatch status      current values and alerts
        %gpuwatch stop [-o VAR]  a static summary, per-cell peaks and the CSV path

        status and stop return their result, shown once as ``Out[]`` (``res = %gpuwatch
        stop`` keeps it; a trailing ``;`` hides it). The result of stop (also ``_gpuwatch``)
        has ``.samples`` (one row per device per sample) and ``.cells`` (peak utilisation,
        peak memory, duration, energy and, with --price, cost_usd per cell); status and stop
        results have ``.processes``: who is on the watched GPUs (pid, user, memory, command).
        Without NVML or an NVIDIA GPU it watches host CPU and RAM and says why.
        ``gpumagic.watch(...)`` starts the same watcher from a script.

        --prometheus: every GPU the selector matches, on every node, from the DCGM exporter
        series in Prometheus (the window's history, then a query every interval): grouped
        by node (tiles past 16 GPUs), stragglers (well below the job's median utilisation),
        XID errors, cell marks, job-wide energy and cost per cell. Its result has
        ``.series`` (time, metric, Hostname, gpu, UUID, modelName, value; the CSV's
        columns), ``.gpus``, ``.cells``, ``.stragglers``, ``.xid_errors``.
        --serve: this kernel's samples as a Prometheus endpoint (``gpumagic.serve_metrics``).
        """
        from IPython.display import display

        from gpumagic.monitor import current

        # "%gpuwatch stop ;": IPython passes the ";" on and drops the Out[] itself.
        opts = PARSER.parse_line(without_silencer(line))
        if opts.action == "start":
            self._start(opts)
            return None
        given = [
            f
            for f, v in (
                ("--price", opts.price),
                ("--idle-alert", opts.idle_alert),
                ("--prometheus", opts.prometheus),
                ("--selector", opts.selector),
                ("--serve", opts.serve),
            )
            if v
        ]
        if given:
            raise PARSER.usage_error(
                f"{' and '.join(given)}: given when starting, not to {opts.action}"
            )
        running = current()
        if running is None:
            display(Note("%gpuwatch: nothing is being watched; start with %gpuwatch", "watch-note"))
            return None
        if opts.action == "status":
            return running.status()
        if opts.output is not None and not opts.output.isidentifier():
            raise PARSER.usage_error(f"-o {opts.output!r}: not a valid variable name")
        result = running.stop()
        ns = self.shell.user_ns  # type: ignore[union-attr]
        ns["_gpuwatch"] = result
        if opts.output:
            ns[opts.output] = result
        return result

    def _start(self, opts: Any) -> None:
        from IPython.display import display

        from gpumagic.monitor import JobWatcher, serve_metrics, watch

        if opts.serve and opts.prometheus:
            raise PARSER.usage_error(
                "--serve serves this kernel's own samples: not with --prometheus"
            )
        if opts.selector and not opts.prometheus:
            raise PARSER.usage_error(
                "--selector picks GPUs among Prometheus's series: give --prometheus URL"
            )
        serve = _host_port(opts.serve) if opts.serve else None
        try:
            watcher = watch(
                opts.interval,
                opts.log,
                opts.gpus,
                opts.window,
                shell=self.shell,
                price=opts.price,
                idle_alert=opts.idle_alert,
                prometheus=opts.prometheus,
                selector=opts.selector,
            )
        except ValueError as exc:  # PrometheusError too: its message names the URL
            raise PARSER.usage_error(str(exc)) from None
        if isinstance(watcher, JobWatcher):
            from gpumagic.render.job_live import start_job_view

            start_job_view(watcher)
            return
        from gpumagic.render.watch_live import start_live_view

        start_live_view(watcher)
        if serve is not None:
            try:
                server = serve_metrics(serve[1], serve[0], watcher)
            except ValueError as exc:
                raise PARSER.usage_error(str(exc)) from None
            display(Note(f"%gpuwatch: serving this kernel's samples at {server.url}", "watch-note"))


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise PARSER.usage_error(
            f"--serve {text!r}: give PORT or HOST:PORT, like 9401 or 0.0.0.0:9401"
        ) from None
    return (host or "127.0.0.1"), number
