"""The demo's report page as a reader sees it: rendered by a real browser (headless Chromium).

The DOM Chromium builds from report.html is checked for what the page must show (base and trained videos of
the same samples, the learning-rate schedule, no '-0.0000', no 'None'); a copy of the page with a small probe
script measures its layout (nothing past the right edge of a 1280-pixel window, no cell whose content spills
out of it) and asks each video for its size (the file is there and the browser can read it); a screenshot
shows it drew something."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import os
import re
import subprocess
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from demo import first_run_id, run
from PIL import Image

from videogrpo.data.video import last_frame
from videogrpo.provenance.cost_page import axis_of

from harness import assert_check_shows_csv

pytestmark = pytest.mark.e2e

WINDOW = "1280,2000"

# Runs once the page has loaded and every video has its metadata (or failed to), then appends its
# measurements to the page, where --dump-dom shows them.
PROBE = """
window.addEventListener('load', () => {
  const viewport = document.documentElement.clientWidth;
  const name = (e) => e.tagName.toLowerCase() + ' ' + (e.textContent || e.getAttribute('src') || '').slice(0, 80);
  const videos = [...document.querySelectorAll('video')];
  const loaded = videos.map((v) => v.readyState >= 1 ? null : new Promise((done) => {
    v.addEventListener('loadedmetadata', done);
    v.addEventListener('error', done);
  }));
  Promise.all(loaded).then(() => {
    const out = document.createElement('pre');
    out.id = 'probe';
    out.textContent = JSON.stringify({
      viewport: viewport,
      scroll_width: document.documentElement.scrollWidth,
      past_right_edge: [...document.body.querySelectorAll('*')]
        .filter((e) => e.getBoundingClientRect().right > viewport + 0.5).map(name),
      spilling_cells: [...document.querySelectorAll('td, th')]
        .filter((c) => c.scrollWidth > c.clientWidth + 1).map(name),
      videos: videos.map((v) => ({src: v.getAttribute('src'), width: v.videoWidth, error: v.error && v.error.code})),
    });
    document.body.appendChild(out);
  });
});
"""


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium as root (no sandbox), without a GPU, with a profile of its own."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


class Page(HTMLParser):
    """The tables (rows of cell texts) and the videos (their attributes) of a DOM."""

    def __init__(self, dom: str):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.videos: list[dict[str, str]] = []
        self.titles: list[tuple[str, str]] = []  # (title, text) of the elements that have a title
        self._cell: list[str] | None = None
        self._title: str | None = None
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "video":
            self.videos.append(attrs)
        if "title" in attrs and tag != "title":
            self._title = attrs["title"]

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._title is not None:
            self.titles.append((self._title, data))
            self._title = None

    def table(self, header: list[str]) -> list[list[str]]:
        (found,) = [t for t in self.tables if t and t[0][: len(header)] == header]
        return found


def test_the_report_page_shows_what_a_reader_looks_for_in_a_browser(demo, workdir, tmp_path):
    run(["make", "chromium"], workdir)
    run(["snakemake", "--cores", "2"], workdir)  # up to date
    run_dir = workdir / "results/runs" / first_run_id(workdir)
    report = run_dir / "report/report.html"

    dom = chromium(tmp_path, f"--window-size={WINDOW}", "--dump-dom", report.as_uri()).stdout
    page = Page(dom)
    assert "<h1>Run " in dom and len(page.tables) >= 6

    # Base and trained side by side: one row per evaluated sample, base then trained, the same task and sample,
    # from the held-out check's two cells (the training sampler's column of the matrix), as the scorer saw them.
    # (the base cell beside the trained one: runs that generate otherwise have base cells of their own)
    (trained,) = workdir.glob(f"results/matrix/*/{run_dir.name}/flowcps-0.7/prepared")
    (base,) = trained.parents[2].glob("base-*/flowcps-0.7/prepared")
    cells = {"base": base, "trained": trained}
    evaluated = {(p.parent.name, p.stem) for p in cells["trained"].rglob("*.mp4")}
    assert len(evaluated) == 6 and evaluated == {(p.parent.name, p.stem) for p in cells["base"].rglob("*.mp4")}
    videos = [v for v in page.videos if "data-variant" in v]
    assert [v["data-variant"] for v in videos] == ["base", "trained"] * len(evaluated)
    shown = []
    for base, trained in zip(videos[::2], videos[1::2]):
        sample = (base["data-task"], base["data-sample"])
        assert (trained["data-task"], trained["data-sample"]) == sample
        for video, variant in ((base, "base"), (trained, "trained")):
            made = cells[variant] / "In-Domain_50" / sample[0] / f"{sample[1]}.mp4"
            assert video["src"] == os.path.relpath(made, report.parent)
            # Before it plays, each video shows its last frame (what the EvalKit scores), not a blank box.
            poster = Image.open(io.BytesIO(base64.b64decode(video["poster"].split(",", 1)[1]))).convert("RGB")
            expected = Image.fromarray(last_frame(made))
            expected.thumbnail((256, 256))
            assert poster.size == expected.size
            assert np.abs(np.asarray(poster, float) - np.asarray(expected, float)).mean() < 4.0  # JPEG's loss
        shown.append(sample)
    assert sorted(shown) == sorted(evaluated)
    (head,) = [t for t in page.tables if t and t[0] == ["task / sample", "base", "trained"]]
    assert [row[0] for row in head[1:]] == [f"{task}{sample}" for task, sample in shown]

    # The learning rate as the schedule set it, each update's distinct.
    metrics = [json.loads(line) for line in (run_dir / "train/metrics.jsonl").read_text().splitlines()]
    table = page.table(["step", "reward_mean"])
    column = [row[table[0].index("learning_rate")] for row in table[1:]]
    assert column == [f"{m['learning_rate']:.2e}" for m in metrics]
    assert all(re.fullmatch(r"\d\.\d\de[-+]\d\d", text) for text in column) and len(set(column)) == len(metrics) > 2

    # No signed zero (the evaluation table as its CSV, a value that rounds to zero without a sign), no None;
    # stages that ran outside SLURM are 'local', with a tooltip saying so.
    text = re.sub(r"<[^>]+>", " ", dom)
    assert not re.search(r"-0\.0+(?![0-9])", text), re.search(r".{80}-0\.0+(?![0-9]).{20}", text)
    with open(run_dir / "matrix/per_task.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["sampler"] == "flowcps-0.7"]  # the held-out check's
    assert_check_shows_csv(page.table(["task", "samples", "base", "trained"]), rows)
    assert ">None<" not in dom and not re.search(
        r"\bNone\b", re.sub(r"<[^>]+>", " ", dom.split("<h2>Configuration")[0])
    )
    jobs = page.table(["stage", "job id"])[1:-1]  # less the header and the totals
    assert {row[1] for row in jobs} == {"local"}  # the demo ran no stage under SLURM
    assert sum(1 for title, cell in page.titles if cell == "local" and "SLURM" in title) == len(jobs)

    # Layout, measured by the browser on a copy of the page with the probe (resolving paths from the report's folder).
    probed = tmp_path / "probed.html"
    probed.write_text(
        report.read_text()
        .replace("<head>", f"<head><base href='{report.parent.as_uri()}/'>", 1)
        .replace("</body>", f"<script>{PROBE}</script></body>", 1)
    )
    probe_dom = chromium(
        tmp_path, f"--window-size={WINDOW}", "--virtual-time-budget=20000", "--dump-dom", probed.as_uri()
    )
    found = re.findall(r'<pre id="probe">(.*?)</pre>', probe_dom.stdout, re.S)
    assert len(found) == 1, f"the probe did not report: {probe_dom.stdout[-2000:]}"
    layout = json.loads(html.unescape(found[0]))
    assert layout["viewport"] > 1200 and layout["scroll_width"] == layout["viewport"], layout
    assert layout["past_right_edge"] == [] and layout["spilling_cells"] == [], layout
    assert len(layout["videos"]) == 2 * len(evaluated)
    assert all(v["width"] == 256 and v["error"] is None for v in layout["videos"]), layout["videos"]

    # The screenshot: a real image of the window's size, with the page drawn on it (plots, videos, text).

    shot = tmp_path / "report.png"
    # The budget lets the videos load their first frame before the shot.
    chromium(
        tmp_path, f"--window-size={WINDOW}", "--virtual-time-budget=20000", f"--screenshot={shot}", report.as_uri()
    )
    with Image.open(shot) as image:
        assert image.format == "PNG" and image.size == (1280, 2000)
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20)
        assert len(colours) > 200, len(colours)  # a blank or failed page has a handful
        white = sum(count for count, colour in colours if colour == (255, 255, 255))
        assert 0.05 < 1 - white / (1280 * 2000), white  # drawn on, not an empty sheet


# Measures every bar of the timeline against its track, once the page has loaded.
TIMELINE_PROBE = """
window.addEventListener('load', () => {
  const out = document.createElement('pre');
  out.id = 'timeline-probe';
  const timeline = document.querySelector('.timeline');
  out.textContent = JSON.stringify({
    span_s: parseFloat(timeline.dataset.spanS),
    breaks: timeline.dataset.breaks || null,
    bars: [...timeline.querySelectorAll('.tl-bar')].map((bar) => {
      const track = bar.parentElement.getBoundingClientRect(), box = bar.getBoundingClientRect();
      return {
        name: bar.closest('.tl-row').dataset.name, title: bar.title, classes: bar.className,
        start_s: parseFloat(bar.dataset.startS), length_s: parseFloat(bar.dataset.lengthS),
        left: box.left - track.left, width: box.width, track: track.width, drawn: getComputedStyle(bar).backgroundColor,
      };
    }),
  });
  document.body.appendChild(out);
});
"""


def test_the_report_page_shows_the_cost_of_every_job_and_their_timeline(demo, workdir, tmp_path):
    run(["make", "chromium"], workdir)
    run(["snakemake", "--cores", "2"], workdir)  # up to date
    run_id = first_run_id(workdir)
    report = workdir / "results/runs" / run_id / "report/report.html"
    listed = json.loads((workdir / f"results/.stage-config/{run_id}.stages.json").read_text())
    manifests = {name: json.loads((workdir / path).read_text()) for name, path in listed.items() if name != "report"}
    order = sorted(manifests, key=lambda name: (manifests[name]["started_at"], name))

    # The table, as the browser's DOM has it: one row per job by start, the manifest's figures, then the totals.
    page = Page(chromium(tmp_path, f"--window-size={WINDOW}", "--dump-dom", report.as_uri()).stdout)
    table = page.table(["stage", "job id", "state", "host", "start", "wall (s)", "CPU-h", "GPUs", "GPU-h"])
    expected = []
    for name in order:
        m = manifests[name]
        cost = m["cost"]
        start = m["started_at"][:19].replace("T", " ")
        expected.append(
            [name, "local", "COMPLETED", m["host"], start, f"{cost['wall_s']:.1f}", f"{cost['cpu_h']:.4f}", "0"]
            + [f"{cost['gpu_h']:.4f}"]
        )
    assert table[1:-1] == expected
    walls = sum(manifests[name]["cost"]["wall_s"] for name in order)
    cpus = sum(manifests[name]["cost"]["cpu_h"] for name in order)
    total = table[-1]
    assert total[0] == f"total ({len(order)} jobs)" and total[4].startswith("span ")
    assert total[5:] == [f"{walls:.1f}", f"{cpus:.4f}", "", "0.0000"]

    # The timeline: a bar per job in the table's order, placed on one axis: linear, but for an idle gap longer
    # than the jobs' busy time (and 10 minutes), cut to a short break; the demo has one where the tests before
    # this one kept it waiting (the cluster tier, say), so the expected axis is axis_of's (tested in test_cost).
    probed = tmp_path / "timeline.html"
    probed.write_text(report.read_text().replace("</body>", f"<script>{TIMELINE_PROBE}</script></body>", 1))
    dom = chromium(tmp_path, f"--window-size={WINDOW}", "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    found = re.findall(r'<pre id="timeline-probe">(.*?)</pre>', dom.stdout, re.S)
    assert len(found) == 1, f"the probe did not report: {dom.stdout[-2000:]}"
    timeline = json.loads(html.unescape(found[0]))
    bars = timeline["bars"]
    t0 = min(datetime.fromisoformat(m["started_at"]).timestamp() for m in manifests.values())
    ends = [datetime.fromisoformat(m["ended_at"]).timestamp() - t0 for m in manifests.values()]
    axis = axis_of(
        [(datetime.fromisoformat(m["started_at"]).timestamp() - t0, end) for m, end in zip(manifests.values(), ends)]
    )
    assert [bar["name"] for bar in bars] == order
    assert timeline["breaks"] == (str(len(axis.breaks)) if axis.breaks else None)
    assert timeline["span_s"] == pytest.approx(max(ends), abs=1e-3)
    for bar in bars:
        m = manifests[bar["name"]]
        start = datetime.fromisoformat(m["started_at"]).timestamp() - t0
        length = datetime.fromisoformat(m["ended_at"]).timestamp() - t0 - start
        assert bar["start_s"] == pytest.approx(start, abs=1e-3) and bar["length_s"] == pytest.approx(length, abs=1e-3)
        assert bar["track"] > 500  # the page's width, less the label and duration columns
        assert bar["left"] == pytest.approx(bar["track"] * axis(start), abs=1.0), bar
        assert bar["width"] == pytest.approx(max(bar["track"] * (axis(start + length) - axis(start)), 2), abs=1.0), bar
        assert bar["title"].startswith(f"{bar['name']}: {m['started_at']} to {m['ended_at']}")
        assert bar["classes"] == "tl-bar" and bar["drawn"] not in ("rgba(0, 0, 0, 0)", "transparent")
