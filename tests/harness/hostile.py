"""A tally of hostile inputs to one surface (an option, a file kind, a door): each input ends refused clearly (an
EdgeTrainError whose message names what is at fault), accepted with a result the test checks, or as a defect
(anything else: a bare Python or numpy exception, a refusal that names nothing, a wrong result). Each case is timed
and its peak of traced memory taken (numpy's allocations are traced), so the report can name the slowest and the
largest refusal. A test reports the tally through conftest's `report` fixture and asserts it has no defect:

    tally = Tally("input pipelines")
    with tally.case("scale 1e-320", names="scale"):
        InputPipeline.from_json({"scale": 1e-320})          # must raise an EdgeTrainError naming 'scale'
    with tally.case("scale 1/255", accept=True):
        check(InputPipeline.from_json({"scale": 1 / 255}))  # must not raise; assertions inside count as defects
    report("hostile inputs", tally.line())
    tally.assert_clean()
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from edgetrain.core.errors import EdgeTrainError


@dataclass
class Tally:
    surface: str
    tried: int = 0
    refused: int = 0
    accepted: int = 0
    defects: list[str] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")
    largest: tuple[float, str] = (0.0, "")

    @contextmanager
    def case(
        self,
        what: str,
        *,
        names: str | tuple[str, ...] | None = None,
        accept: bool = False,
        either: bool = False,
    ) -> Iterator[None]:
        """One input. accept=False: the body must raise an EdgeTrainError whose message contains each of `names`;
        accept=True: the body must finish (its own assertions check the result); either=True: both are right (an
        input that may or may not matter: a refusal must still name `names`, an acceptance pass its assertions)."""
        self.tried += 1
        wanted = (names,) if isinstance(names, str) else tuple(names or ())
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        outcome = None
        try:
            yield
        except EdgeTrainError as e:
            outcome = e
        except Exception as e:  # noqa: BLE001  (what a defect is: anything but the hierarchy's errors)
            self.defects.append(f"{what}: {type(e).__name__}: {e}"[:400])
            return
        finally:
            seconds = time.perf_counter() - t0
            mib = tracemalloc.get_traced_memory()[1] / 2**20
            if started:
                tracemalloc.stop()
        self._judge(what, outcome, wanted, accept or (either and outcome is None), seconds, mib)

    def _judge(
        self, what: str, outcome, wanted: tuple[str, ...], accept: bool, seconds: float, mib: float
    ) -> None:
        if accept:
            if outcome is None:
                self.accepted += 1
            else:
                self.defects.append(f"{what}: refused what is valid: {outcome}"[:400])
            return
        if outcome is None:
            self.defects.append(f"{what}: accepted, not refused")
            return
        missing = [w for w in wanted if w not in str(outcome)]
        if missing:
            self.defects.append(f"{what}: the refusal does not name {missing}: {outcome}"[:400])
            return
        self.refused += 1
        self.slowest = max(self.slowest, (seconds, what))
        self.largest = max(self.largest, (mib, what))

    def line(self) -> str:
        return (
            f"{self.surface}: {self.tried} tried, {self.refused} refused clearly, {self.accepted} accepted "
            f"correctly, {len(self.defects)} defects; slowest refusal {self.slowest[0]:.2f} s ({self.slowest[1]}), "
            f"largest {self.largest[0]:.1f} MiB traced ({self.largest[1]})"
        )

    def assert_clean(self) -> None:
        assert not self.defects, f"{self.surface}: {len(self.defects)} defect(s):\n" + "\n".join(
            self.defects[:20]
        )
