"""Map key and value types rebuilt from the compiler's type descriptions: field names, offsets
and sizes must match the C layout the program was compiled with."""

import ctypes as ct

from memdiag.probes.bpfobj import ctype_of


def test_struct_with_array_bitfield_and_nested_union():
    desc = [
        "key",
        [
            ["tgid", "unsigned int"],
            ["stack_id", "int"],
            ["ip", "unsigned long long"],
            ["comm", "char", [16]],
            ["flags", "unsigned int", 3],
            ["", [["a", "unsigned int"], ["b", "unsigned long long"]], "union"],
        ],
        "struct",
    ]
    t = ctype_of(desc)
    assert [f[0] for f in t._fields_][:5] == ["tgid", "stack_id", "ip", "comm", "flags"]
    assert t.ip.offset == 8 and t.comm.offset == 16 and t.comm.size == 16
    assert ct.sizeof(t) == 48  # 4+4+8+16, bit field in a 4-byte unit (+4 padding), 8-byte union
    v = t(tgid=7, comm=b"leak", flags=5)
    v.b = 1 << 40
    assert (v.tgid, v.comm, v.flags, v.a) == (7, b"leak", 5, 0)


def test_packed_struct_and_scalars():
    packed = ctype_of(["p", [["c", "unsigned char"], ["x", "unsigned long long"]], "struct_packed"])
    assert ct.sizeof(packed) == 9
    assert ctype_of("unsigned long long") is ct.c_ulonglong
    assert ctype_of(["s", [["ips", "unsigned long long", [127]]], "struct"]).ips.size == 127 * 8
