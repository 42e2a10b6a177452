"""A per-sample cache of the frozen prefix's results (numpy only): FeatureRows keeps each sample's boundary rows,
keyed by a digest of the sample's bytes, so that a sample seen before skips the prefix; FeatureCache runs a step
through it. The suffix then runs exactly the nodes the whole program would have run on exactly the same values, so
training is bit for bit what it is without the cache. Where the step is cut is edgetrain.graph.prefix's business."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph
from edgetrain.graph.prefix import Split, split_step

DEFAULT_MAX_BYTES = 64 << 20


# ---- the cache ---------------------------------------------------------------------------------------------------
def _digest(prefix: Graph) -> str:
    """What the prefix computes: its nodes, boundary and every constant's bytes (a program id names the structure
    only, and two artifacts of one structure can hold different frozen weights)."""
    h = hashlib.blake2b(digest_size=16)
    for n in prefix.nodes:
        h.update(f"{n.op_type}:{n.domain}:{n.inputs}>{n.outputs}:{sorted(n.attrs.items())!r}\n".encode())
    h.update(repr(prefix.outputs).encode())
    for name in sorted(prefix.initializers):
        a = np.ascontiguousarray(prefix.initializers[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.data)
    return h.hexdigest()


class FeatureRows:
    """The cached rows: per boundary value one growing slab [samples, ...], an index digest -> slab row, and room
    for `capacity` samples. `tag` names the program whose prefix made them: a session of that same program can
    take them over (a phone's next burst, on a new session of the same artifact)."""

    def __init__(self, tag: str, shapes: list[tuple[int, ...]], dtypes: list[np.dtype], max_bytes: int):
        self.tag = tag
        self.shapes, self.dtypes = shapes, dtypes
        self.row_bytes = sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in zip(shapes, dtypes))
        self.capacity = max(0, int(max_bytes) // max(1, self.row_bytes))
        self.checked = False  # the first batch's check that rows do not depend on their position
        self.clear()

    def clear(self) -> None:
        self.index: dict[bytes, int] = {}
        self.slabs = [np.empty((0,) + s, d) for s, d in zip(self.shapes, self.dtypes)]

    @property
    def samples(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.slabs)

    def store(self, keys: list[bytes], where: list[int | None], values: list[np.ndarray]) -> None:
        """Keeps the rows of samples not cached yet, while there is room (no eviction: an epoch visits every
        sample once, so evicting would trade one miss for another)."""
        new: list[int] = []
        seen: set[bytes] = set()
        for i, (k, w) in enumerate(zip(keys, where)):
            if w is None and k not in seen and k not in self.index:
                seen.add(k)
                new.append(i)
        new = new[: max(0, self.capacity - len(self.index))]
        if not new:
            return
        start, end = len(self.index), len(self.index) + len(new)
        if end > self.slabs[0].shape[0]:  # grow geometrically, never past the capacity
            size = min(self.capacity, max(end, 2 * self.slabs[0].shape[0], 64))
            grown = []
            for slab in self.slabs:
                g = np.empty((size,) + slab.shape[1:], slab.dtype)
                g[: slab.shape[0]] = slab
                grown.append(g)
            self.slabs = grown
        rows = np.asarray(new, np.intp)
        for slab, v in zip(self.slabs, values):
            slab[start:end] = v[rows]
        for j, i in enumerate(new):
            self.index[keys[i]] = start + j


class FeatureCache:
    """A step through the cache: the boundary rows of a batch from FeatureRows when every sample is there, else
    from the prefix run on the batch (and kept); then the step program's outputs from the suffix."""

    def __init__(
        self,
        split: Split,
        *,
        tag: str,
        max_bytes: int = DEFAULT_MAX_BYTES,
        bind: Mapping[str, np.ndarray] | None = None,
        rows: FeatureRows | None = None,
    ):
        self.split = split
        # each half under a memory plan of its own: without one, every activation would hold a buffer of its own
        from edgetrain.graph.memory import planned_interpreter  # start-up: the planner loads on first use

        alone = {
            n.name for n in split.prefix.nodes
        }  # each sample's rows computed on their own (BATCH_MIXING)
        self.prefix = planned_interpreter(split.prefix, lean=False, per_sample=alone)
        self.suffix = planned_interpreter(
            split.suffix, bind=bind
        )  # bind: the step's outputs, into the caller's
        g = split.prefix
        shapes = [tuple(g.values[v].shape[1:]) for v in split.boundary]
        dtypes = [np.dtype(g.values[v].dtype) for v in split.boundary]
        tag = f"{tag}:{_digest(split.prefix)}"
        fits = rows is not None and rows.tag == tag and rows.shapes == shapes and rows.dtypes == dtypes
        self.rows = rows if fits else FeatureRows(tag, shapes, dtypes, max_bytes)
        self._batch_bufs = [np.empty(g.values[v].shape, d) for v, d in zip(split.boundary, dtypes)]
        self.hits = self.misses = 0

    def keys(self, data: Mapping[str, np.ndarray]) -> list[bytes]:
        """A digest of each sample's bytes (every input the prefix reads): equal samples share their rows, and a
        changed sample is a new one."""
        arrays = [np.ascontiguousarray(data[name]) for name in self.split.prefix.inputs]
        out = []
        for i in range(arrays[0].shape[0]):
            h = hashlib.blake2b(digest_size=16)
            for a in arrays:
                h.update(a[i].data)
            out.append(h.digest())
        return out

    def rows_independent(self, data: Mapping[str, np.ndarray]) -> bool:
        """The prefix on the batch and on the batch reversed give the same rows, bit for bit."""
        feeds = {k: data[k] for k in self.split.prefix.inputs}
        n = next(iter(feeds.values())).shape[0]
        if n < 2:
            return True
        flipped = {k: np.ascontiguousarray(v[::-1]) for k, v in feeds.items()}
        a, b = self.prefix.run(feeds), self.prefix.run(flipped)
        return all(np.array_equal(x[::-1], y, equal_nan=True) for x, y in zip(a, b))

    def position_dependent(self, data: Mapping[str, np.ndarray]) -> list[str]:
        """The prefix's values whose rows differ, bit for bit, between the batch and the batch reversed: where a
        sample's results depend on its position in the batch."""
        feeds = {k: data[k] for k in self.split.prefix.inputs}
        if next(iter(feeds.values())).shape[0] < 2:
            return []
        g = self.split.prefix
        rows = set(g.inputs)  # the values computed from the data (the others are constants)
        for n in g.nodes:
            if any(i in rows for i in n.inputs):
                rows.update(o for o in n.outputs if o)
        every = g.copy(outputs=list(dict.fromkeys(o for n in g.nodes for o in n.outputs if o in rows)))
        run = Interpreter(every, preallocate=False, per_sample={n.name for n in g.nodes})
        flipped = {k: np.ascontiguousarray(v[::-1]) for k, v in feeds.items()}
        a, b = run.run(feeds), run.run(flipped)
        axes = self.split.batch_axes  # a value may hold its samples along another axis (a recurrence's Y)
        return [
            name
            for name, x, y in zip(every.outputs, a, b)
            if not np.array_equal(np.flip(x, axis=axes.get(name, 0)), y, equal_nan=True)
        ]

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The step program's outputs for feeds (the whole program's feeds)."""
        keys = self.keys(feeds)
        rows = self.rows
        where = [rows.index.get(k) for k in keys]
        if all(w is not None for w in where):
            idx = np.asarray(where, np.intp)
            for slab, buf in zip(rows.slabs, self._batch_bufs):
                np.take(slab, idx, axis=0, out=buf)
            values = self._batch_bufs
            self.hits += len(keys)
        else:
            values = self.prefix.run({k: feeds[k] for k in self.split.prefix.inputs})
            self.misses += len(
                keys
            )  # the whole batch went through the prefix (it runs at the program's batch)
            rows.store(keys, where, values)
        sfeeds = dict(zip(self.split.boundary, values))
        for name in self.split.suffix.inputs:
            if name not in sfeeds:
                sfeeds[name] = feeds[name]
        return self.suffix.run(sfeeds)

    def info(self) -> dict[str, Any]:
        return {
            "boundary": list(self.split.boundary),
            "prefix_nodes": self.split.prefix_nodes,
            "total_nodes": self.split.total_nodes,
            "row_bytes": self.rows.row_bytes,
            "capacity": self.rows.capacity,
            "samples": self.rows.samples,
            "bytes": self.rows.nbytes,
            "hits": self.hits,
            "misses": self.misses,
        }


class StepCache:
    """A session's feature cache over its step program: on when enabled and the step has a frozen prefix worth
    caching, checked on the first batch (rows must not move with their position in the batch), cut back before
    nodes that move them, or off with the reason."""

    def __init__(
        self, program: Interpreter, data_inputs: list[str], split: tuple[Split | None, str], tag: str
    ):
        self.program, self.data_inputs, self.split, self.tag = program, data_inputs, split, tag
        self.cache: FeatureCache | None = None
        self.reason = "not enabled"
        self.args: dict[str, Any] = {}  # FeatureCache's settings, for a prefix cut back (see _checked)

    def enable(self, max_bytes: int, bind: dict, rows: Any) -> None:
        split, reason = self.split
        if split is None:
            self.cache, self.reason = None, reason
        else:
            self.args = {"tag": self.tag, "max_bytes": max_bytes, "bind": bind, "rows": rows}
            self.cache, self.reason = FeatureCache(split, **self.args), ""

    def disable(self, reason: str) -> None:
        self.cache, self.reason = None, reason

    def info(self) -> dict[str, Any]:
        if self.cache is None:
            return {"enabled": False, "reason": self.reason}
        return {"enabled": True, "reason": "", **self.cache.info()}

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        cache = self.cache
        if cache is None:
            return self.program.run(feeds)
        if not cache.rows.checked:
            cache = self._checked(cache, feeds)
            if cache is None:
                return self.program.run(feeds)
        return cache.run(feeds)

    def _checked(self, cache: FeatureCache, feeds: dict[str, np.ndarray]) -> FeatureCache | None:
        """The cache, once its prefix gives each sample of the first batch the same rows wherever the sample sits
        in the batch; or None (the cache turned off). Where only the prefix's last nodes move rows (a BLAS whose
        matrix product rounds a row by its position in the batch), the prefix is cut back before them and the
        cut prefix is checked in turn: the convolutions stay cached, the products run in every step."""
        moving: set[str] = set()
        while True:
            if cache.rows_independent(feeds):
                cache.rows.checked = True
                return cache
            found = set(cache.position_dependent(feeds)) - moving
            if not found:
                break
            moving |= found
            split, _ = split_step(self.program.graph, self.data_inputs, exclude=moving)
            if split is None:
                break
            cache = self.cache = FeatureCache(split, **self.args)
        self.disable(
            "the frozen part's results for a sample change with its position in the batch (checked on "
            "the first batch, bit for bit), so they cannot be reused across batches"
        )
        return None
