"""The figures the docs quote from a benchmark run are that run's.

Each test reads a sentence of the README or docs/ and the JSON the benchmark
wrote beside its table in docs/results/, and checks one against the other, so
that a new `make bench` whose figures move makes the prose that quotes them
fail here until it says what is true again.
"""

import json
import pathlib
import re
import statistics

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

pytestmark = pytest.mark.pipeline_independent  # files, read the same under both pipelines


def _text(name):
    return " ".join((ROOT / name).read_text().split())  # one line: sentences wrap anywhere


def _results(name):
    return json.loads((RESULTS / name).read_text())


def test_the_cache_hit_figures_are_the_latest_runs():
    hits = {r["case"]: r for r in _results("performance-results.json")["cache_hits"]}
    met = sum(r["vs_floor"] <= 1.05 for r in hits.values())
    words = {1: "one", 2: "two", 3: "three", 4: "four"}
    claim = (
        f"the 1.05x target is met on none of the {words[len(hits)]} calls"
        if met == 0
        else f"the 1.05x target is met on {words[met]} call{'s' if met > 1 else ''} of {words[len(hits)]}"
    )
    text = _text("docs/performance.md")
    assert claim in text
    floor = [r["vs_floor"] for r in hits.values()]
    assert f"FrozenConst is at {min(floor):.2f}x to {max(floor):.2f}x of it" in text
    each = (
        f"{hits['jnp.add(x, 1)']['vs_floor']:.3f}x on `jnp.add(x, 1)`, "
        f"{hits['jnp.dot(x, w)']['vs_floor']:.3f}x on `jnp.dot(x, w)`, {hits['x @ w']['vs_floor']:.3f}x on "
        f"`x @ w` and {hits['jitted f(x)']['vs_floor']:.3f}x as a `jax.jit` argument"
    )
    assert each in text
    cache = [r["vs_cache_floor"] for r in hits.values()]
    assert f"FrozenConst is at {min(cache):.3f}x to {max(cache):.3f}x of it" in text


def test_the_per_call_figures_are_the_latest_constants_runs():
    rows = _results("constants-results.json")["rows"]

    def span(pipeline, variant, key):
        wanted = (pipeline, variant, "16 B")
        got = [r[key] for r in rows if (r["pipeline"], r["variant"], r["size"]) == wanted]
        return f"{min(got):.3f}x to {max(got):.3f}x"

    text = _text("docs/performance.md")
    ours, floor = "frozenconst.jit", "Python layer (floor)"
    assert f"`frozenconst.jit` is at {span('default', ours, 'vs_best_jax_jit')} of the better" in text
    assert f"({span('simplified', ours, 'vs_best_jax_jit')} under the simplified one)" in text
    assert f"the floor itself is at {span('default', floor, 'vs_best_jax_jit')}" in text
    assert f"({span('simplified', floor, 'vs_best_jax_jit')}): against the floor" in text
    against = f"{span('default', ours, 'vs_floor')} ({span('simplified', ours, 'vs_floor')})"
    assert f"`frozenconst.jit` is at {against}" in text


def test_the_comparison_quoted_is_the_latest_runs():
    compare = _results("benchmark-compare.json")
    rows = {r["quantity"]: r for r in compare["rows"]}
    gated = [r["change"] for r in rows.values() if r["gated"]]
    control = [r["change"] for r in rows.values() if not r["gated"]]
    text = _text("docs/design/benchmarks.md")
    assert all(r["within"] for r in rows.values() if r["gated"])
    assert f"against `{compare['base_rev']}`, the commit before them: {compare['pairs']} pairs" in text
    assert f"(changes {min(gated):.3f} to {max(gated):.3f}; the control" in text
    assert f"moved {control[0]:.3f})" in text

    def span(floor, side):
        got = [r[side] for name, r in rows.items() if name.endswith(f"ratio to the {floor}")]
        return f"{min(got):.3f}x to {max(got):.3f}x"

    assert (
        f"{span('one-slot floor', 'base_ratio')} before and {span('one-slot floor', 'working_ratio')} after"
        in text
    )
    assert (
        f"{span('one-slot cache floor', 'base_ratio')} before and "
        f"{span('one-slot cache floor', 'working_ratio')} after" in text
    )


def test_the_sha256_speed_is_the_latest_runs():
    (sha,) = [
        r["gbs"] for r in _results("performance-results.json")["fingerprint"] if r["what"] == "hashlib.sha256"
    ]
    assert f"`hashlib.sha256` with the CPU's SHA instructions, {sha:.1f} GB/s" in _text("docs/performance.md")


def test_the_disk_peaks_are_the_latest_runs():
    rows = _results("disk-results.json")["rows"]

    def peaks(mode):
        return sorted(round(r["build_peak_growth"] / r["nbytes"], 2) for r in rows if r["mode"] == mode)

    mapped, loaded = peaks("mmap + FrozenConst"), peaks("np.load + FrozenConst")
    low, high = f"{mapped[0]:.2f}x", f"{mapped[-1]:.2f}x"
    assert set(loaded) == {2.0}, loaded
    assert f"grows by {high} the constant's size" in _text("docs/performance.md")
    assert f"and {low} at 1 GiB" in _text("docs/performance.md")
    assert f"grows by {low} to {high} the constant" in _text("docs/model.md")
    for name in ("docs/performance.md", "docs/model.md"):
        assert "2.0x in both" not in _text(name) and "still shows 2.0x" not in _text(name)


def test_the_whisper_figures_are_the_static_slices_runs():
    rows = {
        (r["pipeline"], r["variant"]): r["hlo_bytes"] for r in _results("static-slices-results.json")["rows"]
    }
    ours, jitted, array, numpy = (
        rows[("default", v)] for v in ("frozenconst.jit", "FrozenConst", "jax.Array", "numpy")
    )
    run = _results("static-slices-results.json")["environment"]["frozenconst"].split(" at ")[1]
    text = _text("docs/performance.md")
    assert f"at commit `{run}`:" in text  # the run's own commit, quoted with its figures
    assert (
        f"{ours / 1e3:.1f} KB under `frozenconst.jit` and {jitted / 1e3:.1f} KB under `jax.jit` "
        f"({jitted / numpy:.2f}x the NumPy original's {numpy / 1e3:.1f} KB" in text
    )
    whole = f"against {array / 1e3:.0f} KB for a `jax.Array` mask under `jax.jit` ({array / numpy:.1f}x"
    assert whole in text


def test_the_alternatives_are_the_sweeps_figures():
    # The measured alternatives are docs/performance.md's (the README cites one figure: the
    # 40-layer program's size, checked below).
    rows = _results("benchmark-results.json")["rows"]
    at = {(r["pipeline"], r["variant"]): r for r in rows if (r["layers"], r["mib"]) == (40, 4.0)}
    base = {p: at[(p, "argument")]["hlo_bytes"] for p in ("default", "simplified")}
    embedded = at[("default", "numpy-closure")]["hlo_bytes"] / base["default"]
    passed = at[("simplified", "jnp.array-closure")]["hlo_bytes"] / base["simplified"]
    program = at[("default", "numpy-closure")]["hlo_bytes"] / 1e6
    for page in ("README.md", "README-pypi.md", "docs/performance.md"):
        assert f"{program:.1f} MB of program text" in _text(page), page
    assert f"The {embedded:.0f}x is for that program" in _text("docs/performance.md")
    text = _text("docs/performance.md")
    assert f"embedded: {embedded:.0f}x the HLO, 0 device buffers" in text
    assert f"one device copy per use: {at[('simplified', 'numpy-closure')]['live_copies']} copies" in text
    row = f"| embedded: {embedded:.0f}x the HLO (and 1 buffer) | 1 buffer, {passed:.2f}x the HLO |"
    assert f"`jnp.array` closed over, `jax.jit` {row}" in text
    assert f"pipeline's own program for a `jnp.array` closed over is {passed:.2f}x" in text
    # A FrozenConst closed over: the same program under plain `jax.jit` and `frozenconst.jit`,
    # at every point of the sweep, one copy, and the quoted ratio to the as-argument program.
    argument = {
        (r["pipeline"], r["layers"], r["mib"]): r["hlo_bytes"] for r in rows if r["variant"] == "argument"
    }
    closed = {
        (r["pipeline"], r["layers"], r["mib"]): r["hlo_bytes"]
        for r in rows
        if r["variant"] == "frozenconst-closure"
    }
    mine = [r for r in rows if r["variant"] == "frozenconst.jit"]
    assert mine and all(r["live_copies"] == 1 for r in rows if r["variant"].startswith("frozenconst"))
    assert all(closed[(r["pipeline"], r["layers"], r["mib"])] == r["hlo_bytes"] for r in mine)
    ratio = [r["hlo_bytes"] / argument[(r["pipeline"], r["layers"], r["mib"])] for r in mine]
    assert (
        f"{min(ratio):.2f}x to {max(ratio):.2f}x the as-argument program under JAX's default and under"
        in text
    )
    for pipeline in ("default", "simplified"):
        row = f"| 1 buffer, {at[(pipeline, 'frozenconst.jit')]['hlo_bytes'] / base[pipeline]:.2f}x the HLO |"
        assert row in text


def test_no_benchmark_duration_is_quoted_that_no_run_measured():
    for name in ("README.md", "CONTRIBUTING.md", "docs/performance.md"):
        text = _text(name)
        assert not re.search(r"make bench[^.]*about (ten|nine|\w+) minutes", text), name
        assert "about half an hour" not in text, name


# Every results file names where and when it was measured: the stamp of
# `benchmarks._harness.environment()`, the date, the processor, the frozenconst commit and the
# versions; a table in its Markdown, a dict under "environment" in its JSON.
_STAMP = ("date", "cpu", "frozenconst", "python", "jax", "jaxlib", "numpy", "backend")
_DATE = r"20\d\d-\d\d-\d\d \d\d:\d\d UTC"
_REVISION = r"\d+\.\d+\.\d+\S* at [0-9a-f]{7,}(-dirty)?"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_each_results_json_carries_its_stamp(path):
    env = json.loads(path.read_text())["environment"]
    assert [key for key in _STAMP if not env.get(key)] == [], env
    assert re.fullmatch(_DATE, env["date"]) and re.fullmatch(_REVISION, env["frozenconst"]), env


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.md")), ids=lambda p: p.name)
def test_each_results_table_carries_its_stamp(path):
    text = " ".join(path.read_text().split())
    assert re.search(_DATE, text) and re.search(r"frozenconst:? " + _REVISION, text), path.name
    assert re.search(r"\bjax:? \d+\.\d+", text) and re.search(r"\bcpu:? \S", text), path.name


def test_the_fine_tuning_figures_are_the_latest_runs():
    pipelines = _results("finetune-results.json")["pipelines"]
    text = _text("docs/performance.md")

    def rows(pipeline, compare=False):
        return [r for r in pipelines[pipeline]["rows"] if r["example"].startswith("(compare)") == compare]

    def span(pipeline):
        got = [r["ratio"] for r in rows(pipeline)]
        return f"{min(got):.2f}x to {max(got):.2f}x"

    within = sum(r["ratio"] <= 1.10 for p in pipelines for r in rows(p))
    total = sum(len(rows(p)) for p in pipelines)
    assert f"{span('default')} the original's under the default pipeline and {span('simplified')}" in text
    assert f"({within} of {total} within 1.10x;" in text
    # Each row the median of its processes' ratios, and the spread the docs quote.
    (processes,) = {pipelines[p]["processes"] for p in pipelines}
    for row in (r for p in pipelines for r in rows(p)):
        assert len(row["ratios"]) == processes and row["ratio"] == statistics.median(row["ratios"])
    spread = max(max(r["ratios"]) - min(r["ratios"]) for p in pipelines for r in rows(p))
    assert f"median of {processes} fresh processes: one process's ratio moves by up to {spread:.2f}x" in text
    # The memory claims: never more live bytes for the frozen part, the same result bytes.
    everything = [r for p in pipelines for r in rows(p)]
    assert all(r["frozen_live_bytes"] <= r["original_live_bytes"] for r in everything)
    assert all(r["frozen_result_bytes"] == r["original_result_bytes"] for r in everything)
    assert "equal to or below the original's in every row" in text
    (eqx,) = [r for r in rows("default", compare=True) if "filter_jit" in r["example"]]
    assert f"under `frozenconst.filter_jit` the equinox step is {eqx['ratio']:.2f}x the original's" in text
    # The equinox step's floor, the one-slot type in the constants' place, beside FrozenConst's.
    floor, ours = (
        {p: r["ratio"] for p in pipelines for r in rows(p, compare) if r["example"].startswith(start)}
        for compare, start in (
            (True, "(compare) equinox, a one-slot pytree type"),
            (False, "equinox frozen layer"),
        )
    )
    assert (
        f"the same step is {floor['default']:.3f}x the original's (default pipeline) and "
        f"{floor['simplified']:.3f}x (simplified), where FrozenConst's is {ours['default']:.3f}x and "
        f"{ours['simplified']:.3f}x"
    ) in text


def test_the_derived_copy_figures_are_the_latest_training_runs():
    results = _results("training-results.json")
    text = _text("docs/performance.md")
    for pipeline, named in (("default", "default"), ("simplified", "simplified")):
        rows = {r["step"].rsplit(", ", 1)[1]: r for r in results["pipelines"][pipeline]["derived"]}
        ours, floor = rows["FrozenConst"], rows["one-slot type (the floor)"]
        claim = (
            f"{ours['ratio_to_array']:.2f}x the `jax.Array` step and {ours['ratio_to_floor']:.2f}x the "
            f"one-slot floor, which is itself {floor['ratio_to_array']:.2f}x the `jax.Array` step ({named}"
        )
        assert claim in text


def test_the_any_jit_figures_are_the_latest_runs():
    rows = _results("anyjit-results.json")["rows"]

    def span(pipeline, variant, key):
        got = [r[key] for r in rows if (r["pipeline"], r["variant"]) == (pipeline, variant)]
        return f"{min(got):.2f}x to {max(got):.2f}x"

    text = _text("docs/performance.md")
    closed, ours = "jax.jit, FrozenConsts closed over", "frozenconst.jit, closed over"
    assert (
        f"FrozenConsts is at {span('default', closed, 'call_vs_arguments')} of the argument form per call "
        f"under the default pipeline ({span('simplified', closed, 'call_vs_arguments')} under the "
        "simplified one)" in text
    )
    assert (
        f"is at {span('default', closed, 'compile_vs_arguments')} "
        f"({span('simplified', closed, 'compile_vs_arguments')}): finding" in text
    )
    assert (
        f"and at {span('default', closed, 'call_vs_best_floor')} of the better floor "
        f"({span('simplified', closed, 'call_vs_best_floor')})" in text
    )
    both = [r["call_vs_arguments"] for r in rows if r["variant"] == ours]
    assert f"`frozenconst.jit` is the same program: {min(both):.2f}x to {max(both):.2f}x per call" in text
    # "the more constants, the cheaper against arguments": below the argument form from 10 on.
    assert all(r["call_vs_arguments"] < 1.0 for r in rows if r["k"] >= 10 and r["variant"] == closed)


def test_the_export_figures_are_the_latest_runs():
    rows = {(r["mib"], r["step"]): r for r in _results("export-results.json")["rows"]}
    text = _text("docs/performance.md")
    ours = [rows[(m, "frozenconst.export")]["program_bytes"] for m in (1, 64, 2560)]
    theirs = [rows[(m, "jax.export")]["program_bytes"] for m in (1, 64)]
    assert f"is {ours[0]:,}, {ours[1]:,} and {ours[2]:,} bytes" in text
    assert f"where `jax.export`'s is {theirs[0]:,} and {theirs[1]:,} bytes" in text
    failed = rows[(2560, "jax.export")]
    assert "program_bytes" not in failed and "cannot grow buffer beyond 2 gigabytes" in failed["failed"]
    assert f"fails after {failed['seconds']:.2f} s" in text
    assert f"grown by {failed['peak_growth'] / failed['nbytes']:.2f}x the tables" in text
    save, load = rows[(2560, "frozenconst.export")], rows[(2560, "frozenconst.load")]
    assert (
        f"took {save['seconds']:.2f} s and grew the process by {save['peak_growth'] / save['nbytes']:.2f}x"
        in text
    )
    assert f"loading took {load['seconds']:.2f} s and {load['peak_growth'] / load['nbytes']:.2f}x" in text
    assert f"the first call, which took {load['first_call_seconds']:.2f} s" in text
    assert f"memory grew by {load['anon_growth'] / load['nbytes']:.3f}x the tables before the call" in text
    # The claims: no second copy (anonymous memory) and the peak within 1.1x of the tables.
    assert load["anon_growth"] < load["nbytes"] // 50 and load["peak_growth"] <= 1.1 * load["nbytes"]
    # The size claim: the program independent of the constants' size.
    assert max(ours) < 16384 and all(t > (m << 20) for t, m in zip(theirs, (1, 64), strict=True))


# -- claims that are not benchmark figures ---------------------------------------------------------


def _headings(page):
    """The headings of a docs page, without their `#` marks."""
    return [
        line.lstrip("#").strip() for line in (ROOT / page).read_text().splitlines() if line.startswith("#")
    ]


def _package_strings():
    """(file, text) of every string literal in the package: its messages and docstrings."""
    import io
    import tokenize

    for path in sorted((ROOT / "frozenconst").glob("*.py")):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            # (From Python 3.12 an f-string's text comes as FSTRING_MIDDLE tokens.)
            if token.type in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)):
                yield path.name, " ".join(token.string.replace('\\"', '"').split())


def test_every_docs_section_a_message_names_exists():
    # A message or docstring that sends the user to `docs/<page>.md, "<section>"` names a heading
    # of that page; one that says `(docs: "<title>")` names a heading of some page.
    every = {
        heading for page in (ROOT / "docs").rglob("*.md") for heading in _headings(page.relative_to(ROOT))
    }
    named = 0
    for name, text in _package_strings():
        for page, section in re.findall(r"(docs/[\w/.-]+\.md), \"([^\"]+)\"", text):
            assert any(h.startswith(section) for h in _headings(page)), (name, page, section)
            named += 1
        for title in re.findall(r"docs: \"([^\"]+)\"", text):
            assert any(h.startswith(title) for h in every), (name, title)
            named += 1
    assert named >= 10


def _aliases(put):
    """Whether `put` of a 64-byte aligned, writable NumPy array returns an array over its memory."""
    raw = np.zeros(4096 + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    host = raw[start : start + 4096].view(np.float32)
    host[:] = 1.0
    device = put(host)
    host[0] = 5.0
    return float(device[0]) == 5.0


def test_which_device_copies_alias_numpy_on_this_jax_is_what_the_readme_says():
    import jax
    import jax.numpy as jnp
    from helpers import requires_cpu

    requires_cpu("aliasing")
    old = jax.__version_info__ < (0, 10)
    assert (_aliases(jax.device_put), _aliases(jnp.asarray), _aliases(jnp.array)) == (True, old, False)
    for page in ("README.md", "README-pypi.md"):
        text = _text(page)
        assert "`jax.device_put(a)` aliases a 64-byte aligned NumPy array instead of copying it" in text, page
        assert "on every JAX from 0.8.1 to 0.12, and so does `jnp.asarray(a)` on jax 0.8 and 0.9" in text, (
            page
        )
        assert "(from jax 0.10 it copies, as `jnp.array(a)` does on every version)" in text, page
