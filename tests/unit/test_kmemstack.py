"""kmemstack's pure parts: its cache names, the allocator's frames passed over, its books summed by
stack, its facts, and its lines."""

from types import SimpleNamespace

from memdiag.probes import kmemstack
from memdiag.probes.growth import StackGrowth
from memdiag.probes.kmemstack import KmemResult, KmemStack, allocating_function, cache_of, facts_of, kmem_stack

FRAMES = ["fstatat+0xa [libc.so.6]", "find_config+0x41 [lookups]", "main+0xb8 [lookups]"]
KFRAMES = ["kmem_cache_alloc_lru_noprof+0x235 [kernel]", "__d_alloc+0x2d [kernel]", "d_alloc_parallel+0x39 [kernel]"]
KFUNCTIONS = ["kmem_cache_alloc_lru_noprof", "__d_alloc", "d_alloc_parallel"]


def test_a_cache_is_named_by_the_tracepoint_or_by_kmallocs_size_class():
    assert cache_of("dentry", 192, True) == "dentry"
    assert (cache_of("", 64, False), cache_of("", 192, True)) == ("kmalloc-64", "kmalloc-cg-192")
    assert cache_of("", 16384, False) == "kmalloc-large (pages)"


def test_the_allocation_site_is_the_first_frame_past_the_slab_allocator():
    assert allocating_function(KFUNCTIONS) == "__d_alloc"
    refill = ["__kmalloc_node_noprof", "alloc_slab_obj_exts", "allocate_slab", "___slab_alloc", "__slab_alloc.isra.0",
              "kmem_cache_alloc_lru_noprof", None, "__d_alloc"]  # fmt: skip
    assert allocating_function(refill) == "__d_alloc"  # a new slab's cgroup vector is the dentry's caller's
    assert allocating_function(["kmalloc_trace_noprof", "kmemdup_noprof", "sock_alloc_inode"]) == "sock_alloc_inode"
    assert allocating_function(["kmem_cache_alloc_noprof", None]) is None


def _books(allocs, frees, outstanding, size=192, cache=b"dentry", accounted=0):
    return SimpleNamespace(allocs=allocs, frees=frees, alloc_bytes=allocs * size, outstanding_count=outstanding,
                           outstanding_bytes=outstanding * size, untracked=0, accounted=accounted, size=size,
                           cache=cache + b"\0" * (32 - len(cache)))  # fmt: skip


def test_a_merged_stack_sums_its_keys_books():
    merged = StackGrowth(frames=FRAMES, functions=["fstatat", "find_config", "main"], count=0, bytes=0, pid=7,
                         method="eh_frame", keys=[(7, 1, 0, 0, 3), (7, 2, 0, 0, 3)])  # fmt: skip
    s = kmem_stack(merged, KFRAMES, [_books(10, 2, 8, accounted=10), _books(5, 0, 5, accounted=5)])
    assert (s.cache, s.allocs, s.frees, s.count, s.bytes, s.accounted) == ("dentry", 15, 2, 13, 13 * 192, 15)
    assert s.kernel_functions == KFUNCTIONS
    k = kmem_stack(merged, KFRAMES, [_books(4, 0, 4, size=64, cache=b"", accounted=0)])
    assert k.cache == "kmalloc-64" and k.bytes == 256


def _stack(cache: str, count: int, size: int = 192) -> KmemStack:
    return KmemStack(frames=FRAMES, functions=["fstatat", "find_config", "main"], count=count, bytes=count * size,
                     pid=7, method="eh_frame", kernel_frames=KFRAMES, kernel_functions=KFUNCTIONS, cache=cache,
                     allocs=count + 5, frees=5, alloc_bytes=(count + 5) * size, accounted=count)  # fmt: skip


def test_facts_name_the_cache_the_kernel_site_and_the_user_function_of_the_heaviest_stack():
    r = KmemResult(name="kmemstack", status="ok", duration_s=5.0, allocs=120, frees=10, outstanding=110,
                   outstanding_bytes=100 * 192 + 10 * 64,
                   stacks=[_stack("dentry", 100), _stack("kmalloc-64", 10, 64), _stack("names_cache", 0)])  # fmt: skip
    name = lambda frames, _fw: frames[1].split("+")[0]  # noqa: E731
    f = facts_of(r, None, name)
    assert (f["kmemstack.top_cache"], f["kmemstack.top_kernel_function"], f["kmemstack.top_function"]) == (
        "dentry", "__d_alloc", "find_config")  # fmt: skip
    assert (f["kmemstack.top_count"], f["kmemstack.top_bytes"], f["kmemstack.top_accounted"]) == (100, 19200, True)
    assert f["kmemstack.outstanding_rate"] == r.outstanding_bytes / 5.0
    shown = kmemstack.FACE.stacks.of(r)
    assert [s.count for s in shown] == [100, 10]  # a stack that freed everything is no culprit
    assert shown[0].frames == KFRAMES + FRAMES and "allocated by __d_alloc" in shown[0].detail
    assert kmemstack.FACE.stacks.culprit_of(r, "growth").frames == FRAMES  # the target's code is what to read
    assert [t.cache for t in kmemstack.totals(r.stacks)] == ["dentry", "kmalloc-64", "names_cache"]
    assert any("100 dentry objects outstanding" in line for line in kmemstack.describe(r, 5))
    freed = r.model_copy(update={"stacks": [_stack("names_cache", 0)]})
    assert facts_of(freed, None, name)["kmemstack.top_cache"] is None
    assert facts_of(None, None, name) == {}


def test_the_folded_lines_run_from_the_users_root_to_the_kernels_leaf():
    assert kmemstack.folded_lines([_stack("dentry", 2)]) == [
        "main;find_config;fstatat;d_alloc_parallel;__d_alloc;kmem_cache_alloc_lru_noprof 384"
    ]
