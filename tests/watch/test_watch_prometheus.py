"""A job's GPUs through a real Prometheus, and this kernel's samples scraped by it.

One Prometheus (Debian's package) runs for the module on 127.0.0.1, scraping every second:
``dcgm`` is two nodes' dcgm-exporter pages (tests/watch/dcgm/, served as the exporter
serves them, values moving), ``gpumagic`` is the port ``serve_metrics`` is given here.
"""

from __future__ import annotations

import math
import re
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pandas as pd
import pytest
from prometheus_fixtures import (
    DCGM_PAGES,
    NO_PROMETHEUS,
    PROMETHEUS,
    ExporterDouble,
    PrometheusServer,
    free_port,
    wait_for,
)
from svg_images import svg_images
from watch_nvml_double import MIB, gpu

from gpumagic.device_kinds import CUDA
from gpumagic.monitor import (
    PrometheusError,
    PrometheusSource,
    Watcher,
    WatchResult,
    WatchStatus,
    current,
    serve_metrics,
    stop_current,
    watch,
)
from gpumagic.monitor.job import dcgm

SERIES_COLUMNS = ["time", "metric", "Hostname", "gpu", "UUID", "modelName", "value"]

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)

STRAGGLER = ("node-b", "2")
FAST_FAIL_S = 5.0


class Cluster:
    def __init__(self, prom: PrometheusServer, nodes: list[ExporterDouble], serve_port: int):
        self.prom, self.nodes, self.serve_port = prom, nodes, serve_port
        self.url = prom.url

    def node(self, host: str) -> ExporterDouble:
        return next(n for n in self.nodes if n.host == host)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = [ExporterDouble(DCGM_PAGES / f"{h}.metrics") for h in ("node-a", "node-b")]
    for n in nodes:
        n.start()
    serve_port = free_port()
    prom = PrometheusServer(
        {"dcgm": [f"127.0.0.1:{n.port}" for n in nodes], "gpumagic": [f"127.0.0.1:{serve_port}"]},
        tmp_path_factory.mktemp("prometheus"),
    ).start()
    try:
        # Prometheus applies new targets on a 5 s tick: the first scrapes come after it
        prom.wait_until(
            'count(DCGM_FI_DEV_GPU_UTIL{job="dcgm"})', lambda r: r and r[0]["value"][1] == "8"
        )
        yield Cluster(prom, nodes, serve_port)
    finally:
        stop_current()
        prom.stop()
        for n in nodes:
            n.stop()


def _served(cluster: Cluster, host: str, gpu_index: str, metric: str) -> set[float]:
    return cluster.node(host).served_values(metric, gpu_index)


def test_the_job_view_reads_two_nodes_through_prometheus(cluster, wshell, tmp_path, monkeypatch):
    log = tmp_path / "job.csv"
    w = watch(
        prometheus=cluster.url,
        selector='job="dcgm"',
        interval=1.0,
        log=log,
        price=2.5,
        shell=wshell,
    )
    assert isinstance(w, Watcher) and current() is w
    assert sorted(g.label for g in w.gpus) == [
        f"{h} GPU {i}" for h in ("node-a", "node-b") for i in range(4)
    ]
    # dcgm-exporter's default counters have no SM_ACTIVE: said, not invented
    assert any("DCGM_FI_PROF_SM_ACTIVE" in n for n in w.notes())
    wshell.run_cell("import time; time.sleep(3.2)", store_history=True)
    assert wait_for(lambda: w.samples_taken >= 5, 10)

    status = w.status()
    assert isinstance(status, WatchStatus)
    kinds = {(a.kind, a.device) for a in status.alerts}
    assert ("straggler", "node-b GPU 2") in kinds
    assert ("xid", "node-a GPU 1") in kinds
    assert next(a for a in status.alerts if a.kind == "straggler").device == "node-b GPU 2"
    text = str(status)
    assert "node-b GPU 2 at" in text and "XID error 13" in text
    gpus = status.gpus.set_index(["Hostname", "gpu"])
    assert gpus.loc[STRAGGLER, "utilization"] in _served(cluster, *STRAGGLER, dcgm.UTIL)
    assert gpus.loc[("node-a", "0"), "modelName"] == "NVIDIA H100 80GB HBM3"

    # the live frame: rebuilt only when a sample came in
    from gpumagic.render.watch_views import LiveFrame

    frame = LiveFrame(w)
    first = frame()
    assert "node-a" in first and "node-b GPU 2 at" in first and len(svg_images(first)) == 8
    assert frame() is first or w.seq != frame._cached[0]
    # serving this kernel's samples is not what a job view is for
    with pytest.raises(ValueError, match="reads a job's from Prometheus"):
        serve_metrics(0)

    result = w.stop()
    assert isinstance(result, WatchResult) and current() is None
    series = result.series
    assert list(series.columns) == SERIES_COLUMNS
    assert set(series["metric"]) == {f.name for f in dcgm.JOB_FIELDS} - {dcgm.SM_ACTIVE}
    assert len(series.groupby(["Hostname", "gpu"])) == 8
    # every value shown is one the exporter served for that GPU and field
    for (metric, host, index), values in series.groupby(["metric", "Hostname", "gpu"])["value"]:
        assert set(values) <= _served(cluster, host, index, metric), (metric, host, index)
    moving = series[(series["metric"] == dcgm.UTIL) & (series["Hostname"] == "node-a")]
    assert moving["value"].nunique() >= 2  # the values moved, and the view followed them
    assert series["time"].dt.tz is not None

    slow = result.stragglers
    assert list(zip(slow["Hostname"], slow["gpu"])) == [STRAGGLER]
    assert slow.iloc[0]["job_median"] > 90 and slow.iloc[0]["utilization"] < 40
    xid = result.xid_errors
    assert list(zip(xid["Hostname"], xid["gpu"], xid["xid"])) == [("node-a", "1", 13)]

    # the job's energy is what the counters moved while watched, exactly
    energy = series[series["metric"] == dcgm.ENERGY]
    polled = energy[energy["time"] >= pd.Timestamp(w.started, unit="s", tz="UTC")]
    moved = polled.groupby(["Hostname", "gpu"])["value"].agg(lambda v: v.iloc[-1] - v.iloc[0])
    assert result.energy_wh * 3.6e6 == pytest.approx(moved.sum(), rel=1e-9)
    assert result.energy_wh > 0

    cells = result.cells
    sleepy = cells[cells["source"].str.contains("sleep", na=False)].iloc[0]
    assert sleepy["samples"] >= 2 and sleepy["success"]
    assert "node-b GPU 2" in sleepy["stragglers"]
    assert 80 < sleepy["mean_utilization"] < 100 and sleepy["min_gpu_utilization"] < 40
    # eight GPUs at about 4.6 kW for 3.2 s: about 4 Wh (the polls see the scrapes a second late)
    assert 1.5 < sleepy["energy_wh"] < 7
    hours = sleepy["duration_us"] / 3.6e9
    assert sleepy["cost_usd"] == pytest.approx(2.5 * 8 * hours)
    assert result.cost_usd == pytest.approx(2.5 * 8 * (w.stopped_at - w.started) / 3600)

    # the CSV carries the same series, with the same labels
    logged = pd.read_csv(log, dtype={"gpu": str})
    assert list(logged.columns) == SERIES_COLUMNS
    key = ["metric", "Hostname", "gpu", "value"]
    assert sorted(map(tuple, logged[key].values.tolist())) == sorted(
        map(tuple, series[key].values.tolist())
    )

    bundle = result._repr_mimebundle_()
    html, plain = bundle["text/html"], bundle["text/plain"]
    assert "node-a" in html and "node-b" in html and len(svg_images(html)) >= 8
    assert "GPU 2 ⚠" in html and "XID error 13" in html
    assert "Stragglers over the window" in plain and "node-b GPU 2" in plain
    # past 16 GPUs (here: past 4) each node becomes a row of tiles under one chart
    from gpumagic.render import job as job_view

    monkeypatch.setattr(job_view, "CHARTS_UP_TO", 4)
    compact = result._repr_html_()
    assert len(svg_images(compact)) == 1 and "median (filled)" in compact
    assert compact.count('title="node-') == 8 and "2px solid #d9534f" in compact


def test_serve_metrics_is_what_prometheus_scrapes(cluster, fake_nvml, wshell):
    fake = fake_nvml(
        [
            gpu("NVIDIA H100 80GB HBM3", "GPU-11111111-2222-3333-4444-555555555555", util=10),
            gpu("NVIDIA H100 80GB HBM3", "GPU-66666666-7777-8888-9999-000000000000", util=60),
        ]
    )
    w = watch(interval=0.2, shell=wshell)
    server = serve_metrics(cluster.serve_port, watcher=w)
    assert server.url == f"http://127.0.0.1:{cluster.serve_port}/metrics"
    for k in range(12):  # values move while Prometheus scrapes every second
        fake.gpus[0]["util"] = 20 + k
        fake.gpus[1]["util"] = 70 + k
        fake.gpus[0]["mem_used"] = (2000 + 10 * k) * MIB
        time.sleep(0.4)
    wshell.run_cell("import time; time.sleep(2.5)", store_history=True)
    cluster.prom.wait_until(
        'count_over_time(DCGM_FI_DEV_GPU_UTIL{job="gpumagic", gpu="0"}[2m])',
        lambda r: r and float(r[0]["value"][1]) >= 5,
    )
    # the job view reads this endpoint's series too, and names what dcgm-exporter has and it lacks
    job = Watcher([PrometheusSource(cluster.url, 'job="gpumagic"')], interval=1.0)
    assert [g.label for g in job.gpus] == [
        f"{socket.gethostname()} GPU 0",
        f"{socket.gethostname()} GPU 1",
    ]
    assert any(
        n.startswith(f"{dcgm.ENERGY}: no series at {cluster.url}") and "energy per cell" in n
        for n in job.notes()
    )
    samples = w.stop().samples
    assert server.stopped  # the endpoint stops with its watcher

    for index, device in (("0", "cuda:0"), ("1", "cuda:1")):
        scraped = cluster.prom.query(f'DCGM_FI_DEV_GPU_UTIL{{job="gpumagic", gpu="{index}"}}[2m]')
        assert len(scraped) == 1
        labels = scraped[0]["metric"]
        assert labels["UUID"] == fake.gpus[int(index)]["uuid"]
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert labels["device"] == f"nvidia{index}" and labels["Hostname"] == socket.gethostname()
        mine = samples[samples["device"] == device]
        times = mine["time"].map(pd.Timestamp.timestamp).to_numpy()
        util = mine["utilization_gpu"].to_numpy()
        values = [(float(t), float(v)) for t, v in scraped[0]["values"]]
        assert len({v for _, v in values}) >= 3
        for t, v in values:
            # each scrape served the watcher's latest sample, taken at most an interval before
            near = util[(times >= t - 1.0) & (times <= t + 0.5)]
            assert v in near, (index, t, v)
    used = cluster.prom.query('DCGM_FI_DEV_FB_USED{job="gpumagic", gpu="0"}[2m]')[0]["values"]
    assert {float(v) for _, v in used} <= {2000.0 + 10 * k for k in range(12)} | {1000.0}
    # host and kernel series under names of their own, never as GPU metrics
    assert cluster.prom.query('gpumagic_kernel_rss_bytes{job="gpumagic"}[2m]')
    dcgm_series = cluster.prom.query('{job="gpumagic", __name__=~"DCGM_.*"}[2m]')
    assert {s["metric"]["gpu"] for s in dcgm_series} == {"0", "1"}
    # which cell ran: the flag and the cell's number while it slept
    running = cluster.prom.query('max_over_time(gpumagic_cell_running{job="gpumagic"}[2m])')
    assert running[0]["value"][1] == "1"
    info = cluster.prom.query('gpumagic_cell_info{job="gpumagic"}[2m]')
    assert any("sleep" in s["metric"]["source"] and s["metric"]["execution_count"] for s in info)


def test_a_host_only_endpoint_has_no_dcgm_series():
    from prometheus_client.parser import text_string_to_metric_families

    server = serve_metrics(0)  # no watcher runs: it starts one, and stops it with itself
    try:
        w = server.watcher
        assert w.running and not any(d.kind == CUDA for d in w.devices)
        with urllib.request.urlopen(server.url, timeout=5) as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        assert not [n for n in families if n.startswith("DCGM")]
        rss = families["gpumagic_kernel_rss_bytes"].samples[0]
        assert rss.labels == {"Hostname": socket.gethostname()}
        assert rss.value in set(w.result().samples["process_rss"])
        assert families["gpumagic_cell_running"].samples[0].value == 0.0
    finally:
        server.stop()
    assert not server.watcher.running
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://127.0.0.1:{closed}", "cannot reach Prometheus at http://127.0.0.1:{closed}"),
        ("http://192.0.2.1:9090", "Prometheus at http://192.0.2.1:9090"),  # TEST-NET-1: no one
        ("http://{exporter}", "answered HTTP 404"),  # something else answers there
    ],
)
def test_an_unreachable_prometheus_is_a_clear_error_within_seconds(cluster, url, expected):
    fill = {"closed": free_port(), "exporter": f"127.0.0.1:{cluster.nodes[0].port}"}
    url, expected = url.format(**fill), expected.format(**fill)
    t = time.monotonic()
    with pytest.raises(PrometheusError) as err:
        watch(prometheus=url, timeout=3.0)
    assert time.monotonic() - t < FAST_FAIL_S
    assert expected in str(err.value)
    assert current() is None


def test_a_selector_matching_nothing_names_it(cluster):
    t = time.monotonic()
    with pytest.raises(PrometheusError) as err:
        watch(prometheus=cluster.url, selector='{Hostname="node-z"}')
    assert time.monotonic() - t < FAST_FAIL_S
    message = str(err.value)
    assert f'no GPU series at {cluster.url} match the selector {{Hostname="node-z"}}' in message
    # the two nodes' 8 GPUs, and the 2 of this kernel's endpoint when an earlier test's scrapes
    # are still within Prometheus's look-back (its staleness marker comes a failed scrape later)
    assert re.search(r"DCGM series for (8|10) GPUs", message) and 'Hostname="node-a"' in message
    with pytest.raises(
        PrometheusError, match="bad_data"
    ):  # a malformed selector: Prometheus's word
        watch(prometheus=cluster.url, selector='Hostname="node-a",,')


def test_a_prometheus_without_dcgm_series_says_so(tmp_path):
    empty = PrometheusServer({}, tmp_path).start()
    try:
        t = time.monotonic()
        with pytest.raises(PrometheusError) as err:
            watch(prometheus=empty.url)
        assert time.monotonic() - t < FAST_FAIL_S
        assert f"Prometheus at {empty.url} has no DCGM series ({dcgm.UTIL}" in str(err.value)
        assert "dcgm-exporter" in str(err.value)
    finally:
        empty.stop()


def test_dcgm_blank_values_are_left_out_and_named(cluster):
    node = cluster.node("node-b")
    node.override[("3", dcgm.TEMP)] = str(dcgm.INT64_BLANK + 2)  # DCGM_INT64_NOT_SUPPORTED
    try:
        n = node.scrapes
        assert wait_for(lambda: node.scrapes >= n + 2, 10)
        w = watch(prometheus=cluster.url, selector='job="dcgm", Hostname="node-b"', interval=1.0)
        assert len(w.gpus) == 4
        status = w.status()
        gpus = status.gpus.set_index("gpu")
        assert math.isnan(gpus.loc["3", "temperature_c"]) and gpus.loc["2", "temperature_c"] == 44
        assert any(
            n.startswith(f"{dcgm.TEMP}: DCGM published its 'no value' code for node-b GPU 3")
            for n in status.notes
        )
        result = w.stop()
        temps = result.series[
            (result.series["metric"] == dcgm.TEMP) & (result.series["gpu"] == "3")
        ]
        assert (temps["value"] < 200).all()  # never 9.2e18 °C
    finally:
        node.override.clear()


def test_gpuwatch_prometheus_through_the_magic(cluster, run, ip):
    from IPython.core.error import UsageError

    r = run(f"%gpuwatch --prometheus {cluster.url} --selector 'job=\"dcgm\"' -i 1 --price 3")
    assert r.result.success, r.result.error_in_exec
    assert isinstance(current(), Watcher) and current().layout.view == "job"
    run("import time; time.sleep(1.5)")
    r = run("%gpuwatch status")
    assert isinstance(r.result.result, WatchStatus)
    assert "node-b GPU 2" in r.result.result._repr_mimebundle_()["text/html"]
    r = run("%gpuwatch stop -o")
    result = r.result.result
    assert isinstance(result, WatchResult) and result is ip.user_ns["_gpuwatch"]
    assert result.cost.price == 3.0 and current() is None
    assert len(result.gpus) == 8 and result.gpus["straggler"].sum() == 1

    for line, expected in [
        (
            "%gpuwatch --prometheus http://127.0.0.1:{closed}",
            "cannot reach Prometheus at http://127.0.0.1:",
        ),
        ("%gpuwatch --selector 'job=\"dcgm\"'", "give --prometheus URL"),
        (f"%gpuwatch --prometheus {cluster.url} --serve 9401", "not with --prometheus"),
        (f"%gpuwatch --prometheus {cluster.url} --gpus 0", "selector"),
        ("%gpuwatch --serve nine", "HOST:PORT"),
    ]:
        r = run(line.format(closed=free_port()))
        assert isinstance(r.result.error_in_exec, UsageError), line
        assert expected in str(r.result.error_in_exec), (line, str(r.result.error_in_exec))
        assert current() is None


def test_gpuwatch_serve_through_the_magic(run):
    port = free_port()
    r = run(f"%gpuwatch -i 0.2 --serve 127.0.0.1:{port}")
    assert r.result.success, r.result.error_in_exec
    url = f"http://127.0.0.1:{port}/metrics"
    assert url in r.bundles[-1]["text/plain"]
    with urllib.request.urlopen(url, timeout=5) as page:
        text = page.read().decode()
    assert "gpumagic_host_cpu_percent" in text and "gpumagic_cell_running" in text
    run("%gpuwatch stop")
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_values_of_dcgm_units_and_blanks():
    util = dcgm.JOB_FIELDS[dcgm.FIELD_INDEX[dcgm.UTIL]]
    energy = dcgm.JOB_FIELDS[dcgm.FIELD_INDEX[dcgm.ENERGY]]
    assert dcgm.is_blank(float(dcgm.INT64_BLANK + 2), util)
    assert dcgm.is_blank(dcgm.FP64_BLANK, util) and dcgm.is_blank(math.nan, util)
    assert dcgm.is_blank(float(dcgm.INT32_BLANK + 3), util)
    # an energy counter past 2**31 mJ is a real value (a 700 W GPU gets there within an hour)
    assert not dcgm.is_blank(float(dcgm.INT32_BLANK + 3), energy)
    assert not dcgm.is_blank(97.0, util) and not dcgm.is_blank(0.0, util)


def test_straggler_thresholds():
    from gpumagic.monitor.job.stats import energy_deltas, stragglers_in

    found, median = stragglers_in(np.array([96.0, 97, 95, 31, 98, np.nan]))
    assert median == 96 and [s.gpu for s in found] == [3]
    assert stragglers_in(np.array([96.0, 97, 95, 80]))[0] == []  # 16 points under: not "well below"
    assert [s.gpu for s in stragglers_in(np.array([40.0, 42, 41, 15]))[0]] == [3]  # 25.5 under
    assert stragglers_in(np.array([40.0, 42, 41, 25]))[0] == []  # 15.5 under a median of 40.5
    assert stragglers_in(np.array([10.0, 12, 0]))[0] == []  # an idle job: nobody straggles
    moved = energy_deltas(np.array([100.0, 500.0, np.nan]), np.array([150.0, 20.0, 9.0, 4.0]))
    assert moved.tolist() == [50.0, 0.0, 0.0, 0.0]  # a counter that went back: the driver reloaded
