"""``@frozen`` (bundle/frozen.py) against ``@dataclasses.dataclass(frozen=True)``: each class here is declared twice,
once each way, and the two must behave alike (equality, hash, repr, fields, asdict, replace, the frozen refusal,
defaults), while the pseudo-fields ``@frozen`` does not support are refused by name."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flyship.bundle import model
from flyship.bundle.frozen import frozen

pytestmark = pytest.mark.cpu


def twins(body: dict, name: str = "Point") -> tuple[type, type]:
    """The class ``name`` with ``body`` (annotations and defaults) made by @frozen and by dataclass(frozen=True)."""
    def make() -> type:
        ns = {k: (dataclasses.field(**v) if isinstance(v, dict) else v) for k, v in body.items() if k != "ann"}
        return type(name, (), {"__annotations__": dict(body["ann"]), "__qualname__": name, **ns})

    return frozen(make()), dataclasses.dataclass(frozen=True)(make())


POINT = {"ann": {"x": "int", "y": "int", "tags": "tuple", "extra": "dict"}, "y": 0, "tags": (),
         "extra": {"default_factory": dict}}


def test_a_frozen_class_is_a_dataclass_with_the_same_fields_params_and_match_args():
    ours, theirs = twins(POINT)
    assert dataclasses.is_dataclass(ours) and dataclasses.is_dataclass(ours(1))
    assert [repr(f) for f in dataclasses.fields(ours)] == [repr(f) for f in dataclasses.fields(theirs)]
    assert repr(ours.__dataclass_params__) == repr(theirs.__dataclass_params__)
    assert ours.__match_args__ == theirs.__match_args__ == ("x", "y", "tags", "extra")


def test_equality_hash_and_repr_are_dataclass_ones():
    ours, theirs = twins(POINT)
    a, b = ours(1, 2, ("t",)), theirs(1, 2, ("t",))
    assert repr(a).replace("Point", "X") == repr(b).replace("Point", "X") == "X(x=1, y=2, tags=('t',), extra={})"
    assert a == ours(1, 2, ("t",)) and a != ours(1, 3, ("t",))
    assert a != b  # another class, as two dataclasses of one name are unequal
    assert (a == 1) is False and a.__eq__(1) is NotImplemented
    with pytest.raises(TypeError, match="unhashable type: 'dict'"):
        hash(a)  # a dict field makes the object unhashable, as in dataclasses
    hashable_ours, hashable_theirs = twins({"ann": {"x": "int", "y": "str"}, "y": "s"})
    assert hash(hashable_ours(1)) == hash(hashable_theirs(1)) == hash((1, "s"))


def test_one_field_compares_as_a_tuple_so_nan_equals_itself_as_in_dataclasses():
    ours, theirs = twins({"ann": {"v": "float"}})
    nan = float("nan")
    assert (ours(nan) == ours(nan)) == (theirs(nan) == theirs(nan)) == True  # noqa: E712 - the value is the point
    empty_ours, empty_theirs = twins({"ann": {}})
    assert empty_ours() == empty_ours() and hash(empty_ours()) == hash(empty_theirs()) == hash(())


def test_assigning_or_deleting_a_field_raises_frozen_instance_error():
    ours, _ = twins(POINT)
    p = ours(1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
        p.x = 2
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'new'"):
        p.new = 2
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'y'"):
        del p.y
    assert p.x == 1


def test_replace_asdict_astuple_copy_and_pickle_work_as_on_a_dataclass():
    ours, theirs = twins(POINT)
    a, b = ours(1, tags=(2,)), theirs(1, tags=(2,))
    assert dataclasses.replace(a, y=5) == ours(1, 5, (2,))
    assert dataclasses.asdict(a) == dataclasses.asdict(b) == {"x": 1, "y": 0, "tags": (2,), "extra": {}}
    assert dataclasses.astuple(a) == dataclasses.astuple(b)
    assert copy.deepcopy(a) == a and copy.copy(a) == a
    global Pickled  # pickle finds a class by its module and name
    Pickled = frozen(type("Pickled", (), {"__annotations__": {"x": "int"}, "__qualname__": "Pickled",
                                          "__module__": __name__}))
    assert pickle.loads(pickle.dumps(Pickled(3))) == Pickled(3)


def test_defaults_and_default_factory_give_each_object_its_own_value():
    ours, _ = twins(POINT)
    a, b = ours(1), ours(2)
    assert a.y == 0 and a.tags == () and a.extra == {} and a.extra is not b.extra
    assert ours.y == 0 and "extra" not in ours.__dict__  # a plain default stays a class attribute, a factory not


def test_init_takes_positional_and_keyword_arguments_and_refuses_what_a_dataclass_refuses():
    ours, theirs = twins(POINT)
    assert ours(x=1, extra={"k": 1}).extra == {"k": 1}
    for args, kwargs in (((), {}), ((1, 2, 3, 4, 5), {}), ((1,), {"x": 1}), ((1,), {"z": 1})):
        with pytest.raises(TypeError) as ours_error:
            ours(*args, **kwargs)
        with pytest.raises(TypeError) as theirs_error:
            theirs(*args, **kwargs)
        assert str(ours_error.value).split("__init__()")[-1] == str(theirs_error.value).split("__init__()")[-1]


def test_init_is_compiled_on_first_use_and_the_signature_is_the_dataclass_one():
    ours, theirs = twins(POINT)
    assert "__init__" in ours.__dict__ and not inspect.isfunction(ours.__dict__["__init__"])  # not compiled yet
    assert str(inspect.signature(ours)) == str(inspect.signature(theirs))
    assert inspect.isfunction(ours.__dict__["__init__"])  # the lookup compiled it and put it in place
    assert ours.__init__.__qualname__ == "Point.__init__"


def test_post_init_runs_after_the_fields_are_set():
    seen = []

    @frozen
    class Checked:
        n: int

        def __post_init__(self):
            seen.append(self.n)
            if self.n < 0:
                raise ValueError("negative")

    assert Checked(3).n == 3 and seen == [3]
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)


def test_a_class_keeps_the_methods_it_writes_itself():
    @frozen
    class Named:
        name: str
        rank: int = 0

        def __repr__(self) -> str:
            return f"<{self.name}>"

        def __eq__(self, other):
            return isinstance(other, Named) and self.name == other.name

    assert repr(Named("a")) == "<a>"
    assert Named("a", 1) == Named("a", 2)
    assert hash(Named("a", 1)) == hash(("a", 1))  # dataclass adds __hash__ beside a class's own __eq__


def test_a_subclass_of_a_frozen_class_inherits_its_fields_first():
    @frozen
    class Base:
        a: int
        b: int = 1

    @frozen
    class Child(Base):
        c: int = 2

    assert [f.name for f in dataclasses.fields(Child)] == ["a", "b", "c"]
    assert Child(0) == Child(0, 1, 2) and repr(Child(0)) == "test_a_subclass_of_a_frozen_class_inherits_its_" \
        "fields_first.<locals>.Child(a=0, b=1, c=2)"
    assert Base(0) != Child(0, 1)


def test_fields_keep_their_repr_compare_hash_and_metadata_flags():
    body = {"ann": {"key": "str", "note": "str", "cache": "int"}, "note": {"default": "", "repr": False},
            "cache": {"default": 0, "compare": False, "metadata": {"doc": "not compared"}}}
    ours, theirs = twins(body)
    assert repr(ours("k", "n", 1)).replace("Point", "X") == repr(theirs("k", "n", 1)).replace("Point", "X")
    assert ours("k", "n", 1) == ours("k", "n", 2) and hash(ours("k", "n", 1)) == hash(theirs("k", "n", 2))
    assert dataclasses.fields(ours)[2].metadata == {"doc": "not compared"}


def test_a_cyclic_repr_prints_dots_as_dataclasses_does():
    @frozen
    class Box:
        items: list

    b = Box([])
    b.items.append(b)
    assert repr(b).endswith("Box(items=[...])")


@pytest.mark.parametrize("annotation, what", [
    ("ClassVar[int]", "a ClassVar annotation"), ("typing.ClassVar[int]", "a ClassVar annotation"),
    (ClassVar[int], "a ClassVar annotation"), ("InitVar[int]", "an InitVar annotation"),
    (dataclasses.InitVar[int], "an InitVar annotation"), ("dataclasses.KW_ONLY", "a KW_ONLY marker"),
    (dataclasses.KW_ONLY, "a KW_ONLY marker"),
])
def test_pseudo_field_annotations_are_refused_naming_the_class_and_field(annotation, what):
    cls = type("Odd", (), {"__annotations__": {"x": "int", "extra": annotation}, "__qualname__": "Odd"})
    with pytest.raises(TypeError, match=rf"@frozen class Odd, field 'extra': expected a plain field .* found {what};"):
        frozen(cls)


@pytest.mark.parametrize("kwargs, what", [({"init": False, "default": 0}, r"dataclasses\.field\(init=False\)"),
                                          ({"kw_only": True, "default": 0}, r"dataclasses\.field\(kw_only=True\)")])
def test_fields_frozen_does_not_support_are_refused_naming_the_class_and_field(kwargs, what):
    cls = type("Odd", (), {"__annotations__": {"x": "int"}, "__qualname__": "Odd", "x": dataclasses.field(**kwargs)})
    with pytest.raises(TypeError, match=rf"@frozen class Odd, field 'x': .* found {what}; declare this class with "
                                        r"@dataclasses\.dataclass\(frozen=True\) instead"):
        frozen(cls)


def test_a_mutable_default_a_missing_default_after_a_default_and_an_own_setattr_are_refused():
    with pytest.raises(ValueError, match="mutable default <class 'list'> for field x is not allowed"):
        frozen(type("Odd", (), {"__annotations__": {"x": "list"}, "x": []}))
    with pytest.raises(TypeError, match="non-default argument 'y' follows default argument"):
        frozen(type("Odd", (), {"__annotations__": {"x": "int", "y": "int"}, "x": 0}))
    with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__ in class Odd"):
        frozen(type("Odd", (), {"__annotations__": {"x": "int"}, "__setattr__": lambda s, n, v: None}))


def test_the_manifest_model_is_frozen_dataclasses_that_the_json_reader_and_replace_still_use():
    arg = model.Arg("x", "tensor", rank=2, dtypes=("float32",))
    assert dataclasses.replace(arg, rank=3) == model.Arg("x", "tensor", 3, ("float32",))
    assert dataclasses.asdict(model.Guard({"x": "float32"})) == {"dtypes": {"x": "float32"}, "constraints": (),
                                                                 "alignment": {}}
    with pytest.raises(dataclasses.FrozenInstanceError):
        arg.rank = 1
    assert [f.name for f in dataclasses.fields(model.Launch)] == ["grid", "block", "dynamic_lds"]


values = st.one_of(st.integers(), st.text(max_size=5), st.none(), st.tuples(st.integers()), st.floats())


@given(x=values, y=values, other_x=values, other_y=values)
def test_frozen_and_dataclass_twins_agree_on_any_values(x, y, other_x, other_y):
    ours, theirs = twins({"ann": {"x": "object", "y": "Optional[object]"}, "y": None})
    a, b, a2, b2 = ours(x, y), theirs(x, y), ours(other_x, other_y), theirs(other_x, other_y)
    assert (a == a2) == (b == b2)
    assert repr(a).replace("Point", "X") == repr(b).replace("Point", "X")
    assert hash(a) == hash(b)
    assert dataclasses.asdict(a) == dataclasses.asdict(b) and dataclasses.astuple(a) == dataclasses.astuple(b)
    assert dataclasses.replace(a, y=other_y) == ours(x, other_y)


def test_the_docstring_example_runs():
    import textwrap

    doc = frozen.__doc__
    example = textwrap.dedent(doc.split("Example::\n", 1)[1])
    namespace = {"frozen": frozen, "dataclasses": dataclasses}
    exec(compile(example, "frozen.__doc__", "exec"), namespace)  # noqa: S102 - our own docstring
    assert namespace["Point"](2) == namespace["Point"](2, 0)
