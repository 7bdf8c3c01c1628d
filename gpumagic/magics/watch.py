"""``%gpuwatch``: IPython glue over :mod:`gpumagic.monitor`."""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class, output_can_be_silenced

from gpumagic.magics.args import MagicParser, without_silencer
from gpumagic.render.html import Note

PARSER = MagicParser(
    "%gpuwatch",
    description="Live inline chart of GPU utilisation, memory, temperature and power (host CPU/RAM without a GPU).",
)
PARSER.add_argument("action", nargs="?", default="start", choices=["start", "stop", "status"])
PARSER.add_argument(
    "-i",
    "--interval",
    type=float,
    default=1.0,
    metavar="SECONDS",
    help="seconds between samples (floor 0.1)",
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
    help="what the instance costs per hour: a cost_usd on every cell, the total and the idle share",
)
PARSER.add_argument(
    "--idle-alert",
    metavar="DURATION",
    help="alert when every GPU has been idle this long (30m, 2h, 90 = seconds) while this "
    "kernel holds GPU memory; without a GPU, while no cell runs",
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
                  [--price DOLLARS_PER_HOUR] [--idle-alert DURATION]
        %gpuwatch status      current values and alerts
        %gpuwatch stop [-o VAR]  a static summary, per-cell peaks and the CSV path

        status and stop return their result, shown once as ``Out[]`` (``res = %gpuwatch
        stop`` keeps it; a trailing ``;`` hides it). The result of stop (also ``_gpuwatch``)
        has ``.samples`` (one row per device per sample) and ``.cells`` (peak utilisation,
        peak memory, duration, energy and, with --price, cost_usd per cell); status and stop
        results have ``.processes``: who is on the watched GPUs (pid, user, memory, command).
        Without NVML or an NVIDIA GPU it watches host CPU and RAM and says why.
        ``gpumagic.watch(...)`` starts the same watcher from a script.
        """
        from IPython.display import display

        from gpumagic.monitor import current, watch
        from gpumagic.render.watch_live import start_live_view

        # "%gpuwatch stop ;": IPython passes the ";" on and drops the Out[] itself.
        opts = PARSER.parse_line(without_silencer(line))
        PARSER.check_variable("-o", opts.output)  # before a stop: a bad name stops nothing
        if opts.action == "start":
            try:
                watcher = watch(
                    opts.interval,
                    opts.log,
                    opts.gpus,
                    opts.window,
                    shell=self.shell,
                    price=opts.price,
                    idle_alert=opts.idle_alert,
                )
            except ValueError as exc:
                raise PARSER.usage_error(str(exc)) from None
            start_live_view(watcher)
            return None
        given = [f for f, v in (("--price", opts.price), ("--idle-alert", opts.idle_alert)) if v]
        if given:
            raise PARSER.usage_error(f"{' and '.join(given)}: given when starting, not to {opts.action}")
        running = current()
        if running is None:
            display(Note("%gpuwatch: nothing is being watched; start with %gpuwatch", "watch-note"))
            return None
        if opts.action == "status":
            return running.status()
        result = running.stop()
        ns = self.shell.user_ns  # type: ignore[union-attr]
        ns["_gpuwatch"] = result
        if opts.output:
            ns[opts.output] = result
        return result
