"""``%gpuwatch``: IPython glue over :mod:`gpumagic.monitor`."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class, output_can_be_silenced

from gpumagic.render.html import Note
from gpumagic.usage import (
    MagicParser,
    documented,
    host_port,
    output_option,
    returns_result,
    without_silencer,
)

PARSER = MagicParser(
    "%gpuwatch",
    description="Live inline chart of GPU utilisation, memory, temperature and power (host CPU/RAM "
    "without a GPU); with --prometheus, every GPU of a multi-node job from its DCGM exporters.",
)
PARSER.add_argument(
    "action", nargs="?", default="start", choices=["start", "stop", "status"],
    help="start (the default) a watch and its live chart; status: the values now and the "
    "alerts; stop: the summary, per-cell peaks and the CSV path",
)
# -i/--interval as nvitop's --interval. nvidia-smi's names for the same options are in their
# help, not accepted: each option has one spelling, and the help names it for a -l or --id.
PARSER.add_argument(
    "-i", "--interval", type=float, default=None, metavar="SECONDS",
    help="seconds between samples, nvidia-smi's -l/--loop (floor 0.1; default 1, or 5 with --prometheus)",
)
PARSER.add_argument(
    "--log", metavar="FILE.csv", help="append every sample to this CSV (nvidia-smi's -f/--filename; its column names)"
)
PARSER.add_argument("--gpus", metavar="0,1", help="CUDA indexes to watch, nvidia-smi's --id (default: all visible)")
PARSER.add_argument("--window", type=float, default=300.0, metavar="SECONDS", help="history kept and drawn")
output_option(PARSER, "start returns the Watcher; status and stop return theirs anyway")
PARSER.add_argument(
    "--price", metavar="DOLLARS_PER_HOUR",
    help="what the instance costs per hour: a cost_usd on every cell, the total and the idle "
    "share; with --prometheus, dollars per GPU-hour, times the job's GPUs",
)
PARSER.add_argument(
    "--idle-alert", metavar="DURATION",
    help="alert when every GPU has been idle this long (30m, 2h, 90 = seconds) while this "
    "kernel holds GPU memory; without a GPU, while no cell runs",
)
PARSER.add_argument(
    "--prometheus", metavar="URL",
    help="watch a job's GPUs on every node: the DCGM exporter series this Prometheus holds "
    "(http://prometheus:9090)",
)
PARSER.add_argument(
    "--selector", metavar="LABELS",
    help='with --prometheus, PromQL label matchers picking the job\'s GPUs: Hostname=~"node-[0-3]"',
)
PARSER.add_argument(
    "--serve", type=host_port, metavar="[HOST:]PORT",
    help="also serve this kernel's samples for Prometheus at http://HOST:PORT/metrics (DCGM "
    "names for GPU series; HOST defaults to 127.0.0.1, 0.0.0.0 lets other machines scrape)",
)


@magics_class
class WatchMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        from gpumagic.magics import on_unload
        from gpumagic.monitor import stop_all

        # %unload_ext stops the sampler thread and unregisters the cell events
        on_unload(stop_all)

    @output_can_be_silenced
    @line_magic
    @documented(PARSER)
    def gpuwatch(self, line: str) -> Any:
        """Watch the GPUs while you work: a live chart that keeps updating while other cells run.

        status and stop return their result, shown once as ``Out[]`` (``res = %gpuwatch
        stop`` keeps it; a trailing ``;`` hides it). The result of stop (also ``_gpuwatch``)
        has ``.samples`` (one row per device per sample) and ``.cells`` (peak utilisation,
        peak memory, duration, energy and, with --price, cost_usd per cell); status and stop
        results have ``.processes``: who is on the watched GPUs (pid, user, memory, command).
        Without NVML or an NVIDIA GPU it watches host CPU and RAM and says why. Starting
        while a watch runs replaces it; its result goes to ``_gpuwatch``, and a line says so.
        In a terminal (no live chart) the start is confirmed in one line.
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
        if opts is None:  # -h: the help was printed
            return None
        if opts.action == "start":
            return self._start(opts)
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
        result = running.stop()
        ns = self.shell.user_ns  # type: ignore[union-attr]
        ns["_gpuwatch"] = result
        return result

    def _start(self, opts: Any) -> Any:
        from IPython.display import display

        from gpumagic.monitor import current, watch
        from gpumagic.monitor.exporter import open_endpoint
        from gpumagic.render.live import detect_mode
        from gpumagic.render.watch_live import start_view, started_note

        if opts.serve and opts.prometheus:
            raise PARSER.usage_error(
                "--serve serves this kernel's own samples: not with --prometheus"
            )
        if opts.selector and not opts.prometheus:
            raise PARSER.usage_error(
                "--selector picks GPUs among Prometheus's series: give --prometheus URL"
            )
        serve = opts.serve  # (host, port), or None
        # Bound before the watch is replaced: a port that is taken fails with the running
        # watch untouched (issue 25 item 12).
        endpoint = None
        if serve is not None:
            try:
                endpoint = open_endpoint(serve[1], serve[0])
            except ValueError as exc:
                raise PARSER.usage_error(str(exc)) from None
        previous = current()
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
        except BaseException as exc:
            if endpoint is not None:
                endpoint.stop()
            if isinstance(exc, ValueError):  # PrometheusError too: its message names the URL
                raise PARSER.usage_error(str(exc)) from None
            raise
        if previous is not None and previous is not watcher:
            # watch() stopped it: its result is kept where a stop would have put it
            self.shell.user_ns["_gpuwatch"] = previous.result()  # type: ignore[union-attr]
        # Above the live chart: what happened to an earlier watch; in a terminal, where no
        # chart shows, that this one started.
        note = started_note(watcher, previous, detect_mode() != "off")
        if note is not None:
            display(note)
        start_view(watcher)
        if endpoint is not None:
            endpoint.serve(watcher)
            display(
                Note(f"%gpuwatch: serving this kernel's samples at {endpoint.url}", "watch-note")
            )
        return watcher if returns_result(opts) else None
