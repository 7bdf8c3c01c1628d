"""%%memtrace in a real Jupyter kernel (nbclient): live view, Out[], error outputs."""

from __future__ import annotations

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def execute(cells, allow_errors=True):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", allow_errors=allow_errors
    )
    client.execute()
    return nb


def html_of(cell):
    return "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)


def test_live_view_then_final_report_in_a_kernel():
    nb = execute(
        [
            "%load_ext gpumagic",
            "%%memtrace\nimport time\nx = 0\nfor i in range(25):\n    time.sleep(0.1)\n    x += i\nx",
            "print(_memtrace.live_frames)",
        ],
    )
    traced, frames = nb.cells[1], nb.cells[2]
    kinds = [o.output_type for o in traced.outputs]
    assert "error" not in kinds, traced.outputs
    # the live widget was replaced in place by the final report
    html = html_of(traced)
    assert 'class="gpumagic gpumagic-memtrace"' in html
    assert "gpumagic-memtrace-live" not in html
    assert not any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in traced.outputs
    )
    # Out[] carries the cell's value
    results = [o for o in traced.outputs if o.output_type == "execute_result"]
    assert results and results[0]["data"]["text/plain"] == str(sum(range(25)))
    # the live view pushed at least one frame during the 2.5 s cell
    assert int(frames.outputs[0]["text"].strip()) >= 1


def test_error_cell_in_a_kernel_fails_once_with_the_report():
    nb = execute(["%load_ext gpumagic", "%%memtrace\na = 1\nb = a / 0\n", "print('still alive')"])
    failing = nb.cells[1]
    errors = [o for o in failing.outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0]["ename"] == "ZeroDivisionError"
    assert "failed at line 3" in html_of(failing)
    assert nb.cells[2].outputs[0]["text"].strip() == "still alive"


def test_gpuprofile_live_line_then_report_in_a_kernel():
    nb = execute(
        [
            "%load_ext gpumagic",
            "%%gpuprofile\nimport time, torch, gpumagic\nfor i in range(5):\n"
            "    time.sleep(0.5)\n    torch.randn(64, 64) @ torch.randn(64, 64)\n    gpumagic.step()\n",
            "print(get_ipython().magics_manager.registry['ProfileMagics'].last_live_frames)",
        ],
    )
    profiled, frames = nb.cells[1], nb.cells[2]
    assert "error" not in [o.output_type for o in profiled.outputs], profiled.outputs
    html = html_of(profiled)
    assert 'class="gpumagic gpumagic-profile' in html
    assert "gpumagic-profile-live" not in html
    assert int(frames.outputs[0]["text"].strip()) >= 1


def test_gpuwatch_results_show_once_as_out_in_a_kernel():
    nb = execute(
        [
            "%load_ext gpumagic",
            "%gpuwatch -i 0.1",
            "import time; time.sleep(0.6)",
            "%gpuwatch status",
            "%gpuwatch status;",
            "res = %gpuwatch stop",
            "type(res).__name__, res is _gpuwatch",
            "%gpuwatch -i 0.1",
            "%gpuwatch stop",
            "%gpuwatch -i 0.1",
            "%gpuwatch stop;",
            "%gpuwatch stop",
        ],
        allow_errors=False,
    )
    outputs = [[o.output_type for o in c.outputs] for c in nb.cells]
    live, status, silenced, assigned, kept, stop, stop_silenced, nothing = (
        nb.cells[i] for i in (1, 3, 4, 5, 6, 8, 10, 11)
    )
    # The live chart (a widget while running) became the one-line stopped note in place,
    # told of the stop by the watcher it subscribed to.
    assert 'class="gpumagic gpumagic-watch-stopped"' in html_of(live), live.outputs
    assert not any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in live.outputs
    )
    assert outputs[3] == ["execute_result"], status.outputs
    assert 'class="gpumagic gpumagic-watch-status"' in status.outputs[0]["data"]["text/html"]
    assert silenced.outputs == [] and assigned.outputs == []
    assert kept.outputs[0]["data"]["text/plain"] == "('WatchResult', True)"
    assert outputs[8] == ["execute_result"], stop.outputs
    assert 'class="gpumagic gpumagic-watch-result"' in stop.outputs[0]["data"]["text/html"]
    assert stop_silenced.outputs == []
    assert outputs[11] == ["display_data"]  # nothing to keep: a note, no Out[]
    assert "nothing is being watched" in nothing.outputs[0]["data"]["text/plain"]
