"""README.md's command blocks run as written, each section's in order, as a reader would run them from the
repository's root after the set-up; where the README shows what a command prints, those lines come out. (Its
```python blocks are tests/test_readme.py's.)

The convention, which a reader sees in the README:
- Every ```sh block (or bash, shell) runs, unless the line right above it is the comment
  `<!-- not run by tests: REASON -->`: the set-up and the test command themselves (CI runs them), the commands for
  real machines (a SERVER of your own). A new block without that comment runs, and the test fails if it does not.
- A plain ``` block that comes next after a ```sh block, with only prose between, is that block's output: each of
  its lines appears in the output, in order, at the start of a line, with any number in place of a number (timings
  and accuracies vary between machines), any duration in place of a duration (`14 s` or `1:08`), `...` standing
  for anything, runs of spaces for any spacing and a rule of dashes for one of any length. Where the output says
  an accuracy went `A% -> B%`, B must be higher than A.
- A block runs in bash (`set -eo pipefail`: the first command that fails stops it, named by the test), in a scratch
  folder that holds what the README's commands read from a clone, as symbolic links: `edgetrain/` (the shipped
  models and data), `android_demo/`, `loaders/`, `tools/` and `.venv` (the venv that runs this test, as the set-up
  made it). Outputs stay in the scratch folder.
- Each section of the README (the text under a heading, up to the next heading) stands alone after the set-up, as
  a reader who jumps to it would run it: its blocks run in order in a scratch folder of its own, state carrying
  from block to block as in one terminal (files, and the venv on the PATH from the block that activates it,
  `. .venv/bin/activate`, on; blocks before it run without it). The command-line overview runs on the stand-ins
  its section copies just before it (the shipped LeNet as `model.onnx`, its digits as `mnist/`). Sections run side
  by side (a federated run mostly waits on Flower's polling, a demo computes), and no two sections make a file or
  folder of the same name, so one reader running them all top to bottom in one folder gets the same.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHELLS = {"sh", "bash", "shell"}
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not run by tests:\s*(.*?)\s*-->")
ACTIVATES = re.compile(r"^\s*(?:\.|source)\s+\.venv/bin/activate\b", re.M)
HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)[ \t]*$", re.M)
LINKED = ("edgetrain", "android_demo", "loaders", "tools")  # what the commands read, from the clone
NUMBER = r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
DURATION = rf"(?:{NUMBER} s\b|\d+:\d\d(?::\d\d)?)"  # as edgetrain prints one: 0.4 s, 12 s, 3:05, 1:02:03
GAIN = re.compile(rf"({NUMBER})% -> ({NUMBER})%")


@dataclass
class Block:
    line: int  # the README's line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason given, for a block the tests do not run
    output: str | None  # the output the README shows for it
    section: str = ""  # the heading it comes under ("" above the first)
    section_line: int = 0  # that heading's line


def command_blocks(text: str) -> list[Block]:
    """Every shell block of a README's text, with its marker, the output shown after it and its section."""
    fences = list(FENCE.finditer(text))
    # a '#' line inside a code block (a comment) is no heading
    headings = [h for h in HEADING.finditer(text) if not any(f.start() < h.start() < f.end() for f in fences)]
    blocks = []
    for i, m in enumerate(fences):
        if m.group(1) not in SHELLS:
            continue
        above = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        mark = NOT_RUN.fullmatch(above)
        nxt = fences[i + 1] if i + 1 < len(fences) else None
        output = nxt.group(2) if nxt is not None and nxt.group(1) == "" else None
        heading = next((h for h in reversed(headings) if h.start() < m.start()), None)
        blocks.append(
            Block(
                line=text.count("\n", 0, m.start()) + 1,
                lang=m.group(1),
                code=m.group(2),
                not_run=mark.group(1) if mark else None,
                output=output,
                section=heading.group(1) if heading else "",
                section_line=text.count("\n", 0, heading.start()) + 1 if heading else 0,
            )
        )
    return blocks


def line_pattern(shown: str) -> re.Pattern:
    """A shown output line as a pattern: its text literal, numbers and durations free, '...' anything, spaces any
    spacing, a rule of dashes any length."""
    parts = re.split(rf"(\.\.\.|-{{3,}}|{DURATION}|{NUMBER}|\s+)", shown.strip())
    out = []
    for part in parts:
        if re.fullmatch(DURATION, part):  # a run over a minute prints 1:08 where the README shows 14 s
            out.append(DURATION)
        elif part == "...":
            out.append(".*")
        elif part.startswith("---"):  # a table's rule, as wide as its columns
            out.append("-+")
        elif part and part[0].isspace():
            out.append(r"\s+")
        elif re.fullmatch(NUMBER, part):
            out.append(NUMBER)
        else:
            out.append(re.escape(part))
    return re.compile("".join(out))


def output_faults(shown: str, got: str) -> list[str]:
    """What of the shown output is not in what came out (empty: all of it, in order)."""
    lines = [ln.strip() for ln in got.splitlines()]
    faults, at = [], 0
    for want in shown.splitlines():
        if not want.strip() or want.strip() == "...":
            continue
        pattern = line_pattern(want)
        hit = next((i for i in range(at, len(lines)) if pattern.match(lines[i])), None)
        if hit is None:
            faults.append(f"this line did not come out (after line {at} of the output): {want.strip()!r}")
        else:
            at = hit + 1
    for before, after in GAIN.findall(got):
        if float(after.replace(",", "")) <= float(before.replace(",", "")):
            faults.append(f"an accuracy that should rise did not: {before}% -> {after}%")
    return faults


def run_block(
    block: Block,
    folder: Path,
    env: dict[str, str],
    timeout: float = 900,
    outputs: dict[int, str] | None = None,
) -> list[str]:
    """Runs one block in bash in `folder`; its faults (a failed command, output the README shows that did not
    come out). What it printed goes into `outputs` by the block's line."""
    script = (
        "set -eo pipefail\n"
        "trap 'echo \"README command failed with exit $?: $BASH_COMMAND\" >&2' ERR\n" + block.code
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    where = f"README.md line {block.line}"
    if outputs is not None:
        outputs[block.line] = proc.stdout
    if proc.returncode != 0:
        return [f"{where}: exit {proc.returncode}\n{proc.stdout[-3000:]}"]
    if block.output is None:
        return []
    return [
        f"{where}: {f}\n--- its output ---\n{proc.stdout[-3000:]}"
        for f in output_faults(block.output, proc.stdout)
    ]


def run_blocks(
    blocks: list[Block], folder: Path, venv: Path, outputs: dict[int, str] | None = None
) -> list[str]:
    """Runs every block not marked, in order, in `folder`, as one reader's terminal would: the venv on the PATH
    once a block activates it."""
    bin_dir = str(venv / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != Path(bin_dir)]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(PATH=os.pathsep.join(path), MPLBACKEND="Agg")
    faults = []
    for block in blocks:
        if block.not_run is not None:
            continue
        faults += run_block(block, folder, env, outputs=outputs)
        if ACTIVATES.search(block.code):
            env.update(PATH=os.pathsep.join([bin_dir, *path]), VIRTUAL_ENV=str(venv))
    return faults


def scratch(folder: Path, venv: Path) -> Path:
    """A folder holding what the README's commands read from a clone, as symbolic links, and the venv."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    (folder / ".venv").symlink_to(venv)
    return folder


def run_sections(
    blocks: list[Block],
    folder: Path,
    venv: Path,
    *,
    workers: int | None = None,
    outputs: dict[int, str] | None = None,
) -> tuple[list[str], list[Path]]:
    """Runs each section's blocks (those not marked) with run_blocks in a scratch folder of its own under
    `folder`, `workers` sections at a time (None: all at once); (the faults in the README's order, then the names
    two sections both made; the sections' folders)."""
    sections: dict[int, list[Block]] = {}
    for b in blocks:
        if b.not_run is None:
            sections.setdefault(b.section_line, []).append(b)
    folders = [scratch(folder / f"section-{i}", venv) for i in range(len(sections))]
    # each block is a process of its own: the threads only wait for them
    with ThreadPoolExecutor(max_workers=workers or len(sections)) as pool:
        runs = [pool.submit(run_blocks, bs, f, venv, outputs) for bs, f in zip(sections.values(), folders)]
        faults = [fault for run in runs for fault in run.result()]
    made: dict[str, str] = {}
    for bs, f in zip(sections.values(), folders):
        for name in sorted(p.name for p in f.iterdir() if p.name not in (*LINKED, ".venv")):
            if name in made:
                faults.append(
                    f"README.md line {bs[0].line}: the sections {made[name]!r} and {bs[0].section!r} both make "
                    f"{name!r}: run one after the other in one folder, the second finds the first's in its way"
                )
            made.setdefault(name, bs[0].section)
    return faults, folders


# ---- the README's blocks --------------------------------------------------------------------------------------


def test_every_command_block_is_run_or_says_why_not():
    text = README.read_text(encoding="utf-8")
    kinds = {m.group(1) for m in FENCE.finditer(text)}
    assert kinds <= {"", "python", *SHELLS}, f"blocks of a kind this test does not know: {kinds}"
    blocks = command_blocks(text)
    run = [b for b in blocks if b.not_run is None]
    skipped = [b for b in blocks if b.not_run is not None]
    assert len(run) >= 5 and len(skipped) >= 3, [(b.line, b.not_run) for b in blocks]
    for b in skipped:
        assert len(b.not_run) >= 10, f"README.md line {b.line}: say why the block is not run"
    # the placeholders of real machines never run here, and are marked so
    for b in blocks:
        if "SERVER" in b.code or "flwr run" in b.code:
            assert b.not_run, f"README.md line {b.line} needs machines of your own: mark it"
    # the examples whose output the README shows are run and checked
    shown = [b for b in run if b.output is not None]
    assert any("edgetrain demo" in b.code for b in shown) and any("federate" in b.code for b in shown)


def test_the_check_fails_on_a_failing_block_and_on_output_that_does_not_come_out(tmp_path):
    text = (
        "intro\n\n```sh\necho made > made.txt\n```\n\n```sh\ntrue\nls missing-file\necho never\n```\n\n"
        "<!-- not run by tests: a machine of your own -->\n```sh\nexit 7\n```\n\n"
        "```sh\necho 'accuracy 10.0% -> 12.5%'; echo 'round 2/3: 50 s'\n```\n\n"
        "```\nround 1/3: ... minutes\naccuracy 3.0% -> 4.0%\n```\n\n"
        "```sh\necho 'accuracy 50.0% -> 40.0%'\n```\n\n```\naccuracy 50.0% -> ...\n```\n"
    )
    blocks = command_blocks(text)
    assert [b.not_run for b in blocks] == [None, None, "a machine of your own", None, None]
    faults = run_blocks(blocks, tmp_path, Path(sys.prefix))
    assert (tmp_path / "made.txt").read_text() == "made\n"
    assert len(faults) == 3, faults
    assert "line 7: exit 2" in faults[0] and "ls missing-file" in faults[0] and "never" not in faults[0]
    assert "line 18" in faults[1] and "'round 1/3: ... minutes'" in faults[1]
    assert "line 27" in faults[2] and "did not: 50.0% -> 40.0%" in faults[2]


def test_a_shown_duration_stands_for_any_duration():
    shown = "LoRA      90 steps in 14 s (median step 109 ms): top-1 6.7% -> 21.8%\ndone in 7:36."
    assert not output_faults(
        shown, "LoRA 90 steps in 1:08 (median step 550 ms): top-1 6.7% -> 21.8%\ndone in 9.5 s."
    )
    faults = output_faults(
        shown, "LoRA 90 steps in 14 samples (median step 5 ms): top-1 6.7% -> 21.8%\ndone in 1:02:03."
    )
    assert len(faults) == 1 and "'LoRA      90 steps in 14 s" in faults[0], faults


def test_sections_run_apart_and_may_not_make_the_same_names(tmp_path):
    text = (
        "# one\n\n```sh\necho a > a.txt; echo shared > both.txt\n```\n\n```sh\ncat a.txt\n```\n\n```\na\n```\n\n"
        "```python\n# a comment, no heading\n```\n\n```sh\ntrue\n```\n\n"
        "## two\n\n```sh\ncat a.txt\n```\n\n### three\n\n```sh\necho again > both.txt\n```\n"
    )
    blocks = command_blocks(text)
    assert [b.section for b in blocks] == ["one", "one", "one", "two", "three"]
    outputs: dict[int, str] = {}
    faults, folders = run_sections(blocks, tmp_path, Path(sys.prefix), workers=3, outputs=outputs)
    assert len(folders) == 3 and (folders[0] / "a.txt").exists() and not (folders[1] / "a.txt").exists()
    assert outputs[7] == "a\n"  # state carries within a section
    assert len(faults) == 2, faults
    assert "line 25: exit 1" in faults[0] and "a.txt" in faults[0]  # a section sees no other's files
    assert "'one' and 'three' both make 'both.txt'" in faults[1]


@pytest.mark.slow
def test_the_readme_commands_run_as_written(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "edgetrain").exists():
        pytest.skip(f"the README's commands run in the set-up's venv; {sys.prefix} has no bin/edgetrain")
    pytest.importorskip("flwr", reason="the federated example needs the extra 'federated' (in 'dev')")
    blocks = command_blocks(README.read_text(encoding="utf-8"))
    outputs: dict[int, str] = {}
    # every section at once: the longest (the keyboard demo, the federated run) set the time
    faults, folders = run_sections(blocks, tmp_path, venv, outputs=outputs)
    assert not faults, "\n\n".join(faults)
    made = {p.relative_to(f).parts[0]: f for f in folders for p in f.iterdir()}
    # what the README says the examples leave behind
    for path in ("edgetrain-demo/summary.json", "edgetrain-demo-keyboard/summary.json", "personalized.onnx",
                 "federated/accuracy.png"):  # fmt: skip
        assert (made[path.split("/")[0]] / path).stat().st_size > 0, path
    # the federated plot draws each of the 3 clients in its own color (matplotlib's C0, C1, C2), and the global
    # model as a grey band under them; no fourth client
    png = made["federated"] / "federated" / "accuracy.png"
    drawn = pixels_of(png, CLIENT_COLORS)
    assert all(n > 300 for n in drawn[:3]) and drawn[3] == 0, drawn
    assert pixels_of(png, [GLOBAL_BAND])[0] > 2000
    # the keyboard demo's figures (its table's first six columns, not the timings) are the same on every run:
    # the README's are this default run's, exactly
    keyboard = next(b for b in blocks if b.code.strip() == ".venv/bin/edgetrain demo --model keyboard")
    assert keyboard_table(outputs[keyboard.line]) == keyboard_table(keyboard.output)


def keyboard_table(text: str) -> dict[str, list[str]]:
    """The keyboard table's rows (label -> the figure cells before the timings) in demo output or the README."""
    rows = {}
    for label in ("base model", "LoRA r8 (attn, MLP)", "head-only", "full"):
        m = re.search(rf"^  {re.escape(label)} +(\d+\.\d% .+)$", text, re.M)  # a table row: top-1 first
        assert m, label
        rows[label] = m.group(1).split()[:6]
    return rows


CLIENT_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]  # matplotlib's C0..C3
GLOBAL_BAND = (201, 201, 201)  # grey 0.3 at alpha 0.3 on white


def pixels_of(png: Path, colors: list[tuple[int, int, int]]) -> list[int]:
    """How many pixels of the picture have each color (within a few levels)."""
    import matplotlib.image  # the demo extra's, as the plot itself

    rgb = np.round(matplotlib.image.imread(png)[..., :3] * 255).astype(int)
    return [int((np.abs(rgb - np.array(c)).max(axis=-1) <= 12).sum()) for c in colors]
