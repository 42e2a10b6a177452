"""The pages whose commands the tests run as a reader would: README.md and every docs/*.md. Their shell blocks
run by tests/project/test_readme_commands.py, their ```python blocks by tests/project/test_readme.py; this
module finds the blocks,
runs them and compares what they print with what a page shows.

The convention, which a reader sees in every page:
- Every ```sh block (or bash, shell) runs, unless the line right above it is the comment
  `<!-- not run by tests: REASON -->`: the set-up and the test command themselves (CI runs them), the commands for
  real machines (a SERVER of your own), a run that a test repeats in a smaller form. A new block without that
  comment runs, and the test fails if it does not.
- A plain ``` block that comes next after a ```sh block, with only prose between, is that block's output: each of
  its lines appears in the output, in order, at the start of a line, with any number in place of a number (timings
  and accuracies vary between machines), any duration in place of a duration (`14 s` or `1:08`), `...` standing
  for anything, runs of spaces for any spacing and a rule of dashes for one of any length. Where the output says
  an accuracy went `A% -> B%`, B must be higher than A.
- A block runs in bash (`set -eo pipefail`: the first command that fails stops it, named by the test), in a scratch
  folder that holds what the pages' commands read from a clone, as symbolic links: `edgetrain/` (the shipped
  models and data), `android_demo/`, `loaders/`, `tools/` and `.venv` (the venv that runs this test, as the set-up
  made it). Outputs stay in the scratch folder.
- Each section of a page (the text under a heading, up to the next heading) stands alone after the set-up, as a
  reader who jumps to it would run it: its blocks run in order in a scratch folder of its own, state carrying from
  block to block as in one terminal (files, and the venv on the PATH from the block that activates it,
  `. .venv/bin/activate`, on; blocks before it run without it). Sections run side by side (a federated run mostly
  waits on Flower's polling, a demo computes), and no two sections of one page make a file or folder of the same
  name, so one reader running a page top to bottom in one folder gets the same.
- The ```python blocks of a page run as written, in order, in one namespace (tests/project/test_readme.py).
- Other blocks are data (```json in a report) and do not run.
"""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SHELLS = {"sh", "bash", "shell"}
DATA = {"json"}  # blocks that show data, not commands
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not run by tests:\s*(.*?)\s*-->")
ACTIVATES = re.compile(r"^\s*(?:\.|source)\s+\.venv/bin/activate\b", re.M)
HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)[ \t]*$", re.M)
LINKED = ("edgetrain", "android_demo", "loaders", "tools")  # what the commands read, from the clone
NUMBER = r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
DURATION = rf"(?:{NUMBER} s\b|\d+:\d\d(?::\d\d)?)"  # as edgetrain prints one: 0.4 s, 12 s, 3:05, 1:02:03
GAIN = re.compile(rf"({NUMBER})% -> ({NUMBER})%")


def pages() -> list[Path]:
    """The pages whose blocks the tests run: the README, then docs/ by name."""
    return [README, *sorted(DOCS.glob("*.md"))]


def page_name(page: Path) -> str:
    """A page as a reader names it: its path from the repository's root."""
    return page.relative_to(ROOT).as_posix()


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line before the block's first line, code) of every ```python block of a page's text, in order."""
    return [
        (text.count("\n", 0, m.start(1)), m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S)
    ]


@dataclass
class Block:
    line: int  # the page's line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason given, for a block the tests do not run
    output: str | None  # the output the page shows for it
    section: str = ""  # the heading it comes under ("" above the first)
    section_line: int = 0  # that heading's line
    page: str = "README.md"  # the page it is on, from the repository's root

    @property
    def key(self) -> tuple[str, int]:
        return (self.page, self.line)


def command_blocks(text: str, page: str = "README.md") -> list[Block]:
    """Every shell block of a page's text, with its marker, the output shown after it and its section."""
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
                page=page,
            )
        )
    return blocks


def all_command_blocks() -> list[Block]:
    """The shell blocks of every page, the README's first."""
    return [b for p in pages() for b in command_blocks(p.read_text(encoding="utf-8"), page_name(p))]


def line_pattern(shown: str) -> re.Pattern:
    """A shown output line as a pattern: its text literal, numbers and durations free, '...' anything, spaces any
    spacing, a rule of dashes any length."""
    parts = re.split(rf"(\.\.\.|-{{3,}}|{DURATION}|{NUMBER}|\s+)", shown.strip())
    out = []
    for part in parts:
        if re.fullmatch(DURATION, part):  # a run over a minute prints 1:08 where the page shows 14 s
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
    outputs: dict[tuple[str, int], str] | None = None,
) -> list[str]:
    """Runs one block in bash in `folder`; its faults (a failed command, output the page shows that did not
    come out). What it printed goes into `outputs` by the block's key (page, line)."""
    script = (
        "set -eo pipefail\n"
        f"trap 'echo \"{block.page} command failed with exit $?: $BASH_COMMAND\" >&2' ERR\n" + block.code
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
    where = f"{block.page} line {block.line}"
    if outputs is not None:
        outputs[block.key] = proc.stdout
    if proc.returncode != 0:
        return [f"{where}: exit {proc.returncode}\n{proc.stdout[-3000:]}"]
    if block.output is None:
        return []
    return [
        f"{where}: {f}\n--- its output ---\n{proc.stdout[-3000:]}"
        for f in output_faults(block.output, proc.stdout)
    ]


def run_blocks(
    blocks: list[Block], folder: Path, venv: Path, outputs: dict[tuple[str, int], str] | None = None
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
    """A folder holding what the pages' commands read from a clone, as symbolic links, and the venv."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    (folder / ".venv").symlink_to(venv)
    return folder


def sections(blocks: list[Block]) -> dict[tuple[str, int], list[Block]]:
    """The blocks that run (those not marked), by section ((page, heading line)), in the pages' order."""
    found: dict[tuple[str, int], list[Block]] = {}
    for b in blocks:
        if b.not_run is None:
            found.setdefault((b.page, b.section_line), []).append(b)
    return found


def run_sections(
    blocks: list[Block],
    folder: Path,
    venv: Path,
    *,
    workers: int | None = None,
    outputs: dict[tuple[str, int], str] | None = None,
) -> tuple[list[str], list[Path]]:
    """Runs each section's blocks (those not marked) with run_blocks in a scratch folder of its own under
    `folder`, `workers` sections at a time (None: all at once); (the faults in the pages' order, then the names
    two sections of one page both made; the sections' folders, in the order of sections(blocks))."""
    runs_of = list(sections(blocks).values())
    folders = [scratch(folder / f"section-{i}", venv) for i in range(len(runs_of))]
    # each block is a process of its own: the threads only wait for them
    with ThreadPoolExecutor(max_workers=workers or len(runs_of)) as pool:
        runs = [pool.submit(run_blocks, bs, f, venv, outputs) for bs, f in zip(runs_of, folders)]
        faults = [fault for run in runs for fault in run.result()]
    made: dict[tuple[str, str], str] = {}
    for bs, f in zip(runs_of, folders):
        page = bs[0].page
        for name in sorted(p.name for p in f.iterdir() if p.name not in (*LINKED, ".venv")):
            if (page, name) in made:
                faults.append(
                    f"{page} line {bs[0].line}: the sections {made[page, name]!r} and {bs[0].section!r} both "
                    f"make {name!r}: run one after the other in one folder, the second finds the first's in its way"
                )
            made.setdefault((page, name), bs[0].section)
    return faults, folders
