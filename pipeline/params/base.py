"""What every section's schema is built from, and how the params file is read and a section validated.

- :class:`Section`, the strict base of every schema, and :func:`bounded` with the generous limits and the
  bounded integer types the schemas share;
- the predictor knobs' checks (:func:`knob_value_problem`, :func:`check_knobs`) and window sizes, shared by
  the evaluate and configure schemas and the command line's ``--knob`` flags;
- the file read defensively (:class:`UniqueKeyLoader`, its limits ``MAX_DEPTH`` and ``MAX_NODES``) and one
  section validated into one-line errors (:func:`load_section`, :func:`validate_section`), given the
  section's schema: a stage passes its own, so that it imports no other stage's schema.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
import reprlib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from pipeline.errors import UserError

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
# numpy, scikit-learn and the Trainer take seeds in [0, 2³²)
Seed = Annotated[int, Field(ge=0, lt=2**32)]


def bounded(limit: int, *, least: int = 1, tensor: str | None = None, bytes_each: int = 4) -> Any:
    """An int in [``least``, ``limit``]; above the limit the one-line error names the memory it would take.

    The limits are far above any real run (the GPU profiles' largest values are 10 to 100 times smaller),
    so they only catch slips such as a width of 10¹² that would otherwise end in an allocation error deep
    in a stage. ``tensor`` describes what the value sizes, with ``{n}`` for the value (``"a {n} × 32000
    embedding"``) and ``bytes_each`` the bytes per unit of the value (the other factors times 4 for
    float32); without one the value sizes a loop or a count, and the message says only what is allowed.
    """

    def check(value: int) -> int:
        if value > limit:
            need = ""
            if tensor:
                need = f"{tensor.format(n=f'{value:.2g}')} needs ~{value * bytes_each:.1e} bytes; "
            raise ValueError(f"{need}allowed: ≤ {limit}")
        return value

    low = Field(gt=0) if least == 1 else Field(ge=least)  # as PositiveInt says it: "greater than 0"
    return Annotated[int, low, AfterValidator(check)]


# Generous bounds (see bounded): the GPU profiles' largest values are 10 to 100 times smaller. The memory
# estimates take the other factors of a tensor at typical sizes: 512 wide, 8000 words, 256 tokens, float32.
WIDTH_LIMIT = 65536  # d_model 512, ffn 2048, hidden 32, rank 32
COUNT_LIMIT = 4096  # layers 8, heads 8, beams 5, ensemble samples 16
TOKENS_LIMIT = 2**20  # positions and contexts 32768, vocabulary 16000, buckets 64
BATCH_LIMIT = 65536  # batch 128, shard 512 sentences
STEPS_LIMIT = 10**8  # steps 30000, epochs 5, iterations 25
EXAMPLES_LIMIT = 10**9  # sentences and examples 10000 (a corpus's size bounds them anyway)

ModelWidth = bounded(WIDTH_LIMIT, tensor="a {n} × 8000-word embedding", bytes_each=8000 * 4)
FeedForward = bounded(WIDTH_LIMIT, tensor="a 512 × {n} feed-forward matrix", bytes_each=512 * 4)
Positions = bounded(TOKENS_LIMIT, tensor="a {n} × 512 position table", bytes_each=512 * 4)
Vocabulary = bounded(TOKENS_LIMIT, least=100, tensor="a {n}-word × 512 embedding", bytes_each=512 * 4)
Context = bounded(TOKENS_LIMIT, least=2, tensor="a {n}-token block × 512 wide", bytes_each=512 * 4)
Layers = bounded(COUNT_LIMIT, tensor="{n} layers of 512 wide", bytes_each=12 * 512 * 512 * 4)
Heads = bounded(COUNT_LIMIT)
Beams = bounded(COUNT_LIMIT, tensor="{n} beams × 256 tokens × 8000-word scores", bytes_each=256 * 8000 * 4)
Rank = bounded(WIDTH_LIMIT, tensor="a {n} × 512 projection per head", bytes_each=512 * 4)
Hidden = bounded(WIDTH_LIMIT, tensor="a {n} × 512 hidden layer per head", bytes_each=512 * 4)
# a centroid count is bounded by the training tokens too (the cluster stage's check against its store)
Centroids = bounded(TOKENS_LIMIT, least=2, tensor="{n} centroids × 256 tokens per head", bytes_each=256 * 4)
BatchSize = bounded(BATCH_LIMIT, tensor="{n} sequences × 256 tokens × 512 wide", bytes_each=256 * 512 * 4)
Tokens = bounded(TOKENS_LIMIT)
NonNegativeTokens = bounded(TOKENS_LIMIT, least=0)
Count = bounded(COUNT_LIMIT)
Steps = bounded(STEPS_LIMIT)
NonNegativeSteps = bounded(STEPS_LIMIT, least=0)
Examples = bounded(EXAMPLES_LIMIT)
NonNegativeExamples = bounded(EXAMPLES_LIMIT, least=0)


class Section(BaseModel):
    """Every section rejects unknown keys so a typo never passes silently, and converts no types.

    Strict mode holds for nested sections given as mappings, list items and dict values too; only an int
    is taken for a float, and no float is NaN or infinite (a rate, a margin or a temperature of ``.nan``
    would pass every range check and train or score garbage).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# the attention kinds a graph store holds (the extract and project schemas)
AttentionKindName = Literal["decoder_self", "encoder_self", "cross"]


# every section of the params file, in its order (pipeline.params.sections holds their schemas)
SECTION_NAMES = (
    "prepare",
    "pretrain",
    "teacher",
    "extract",
    "project",
    "cluster",
    "evaluate",
    "configure",
    "par_search",
    "student",
    "report",
)
S = TypeVar("S", bound=Section)


# ----------------------------------------------------------------------------------------------------------
# predictor settings (the evaluate and configure schemas, the command line's --knob flags)


def _window_size(value: int) -> int:
    if value < 0 or (value > 0 and value % 2 == 0):
        raise ValueError("a window size must be 0 (none) or odd (|i − j| ≤ w // 2)")
    if value > TOKENS_LIMIT:
        raise ValueError(f"a window wider than any sequence; allowed: ≤ {TOKENS_LIMIT}")
    return value


WindowSize = Annotated[int, AfterValidator(_window_size)]


# a knob's integer value (buckets, keys, bins, ...) sizes tensors like the section's own counts do
KNOB_LIMIT = TOKENS_LIMIT


def knob_value_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be knob ``key``'s value, or None: knobs are scalars (a number, a string, a
    boolean or null), numbers finite, integers at most :data:`KNOB_LIMIT` (a ``seed`` less than 2³²).

    Shared by the params file's knob grids and the command line's ``--knob`` flags; the predictors check
    each knob's own range when they are built.
    """
    if value is None or isinstance(value, bool | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "must be a finite number"
    if isinstance(value, int):
        limit = 2**32 - 1 if key == "seed" else KNOB_LIMIT
        return None if abs(value) <= limit else f"allowed: at most {limit}"
    return f"allowed: a number, a string, true/false or null, not {YAML_KINDS.get(type(value), 'this')}"


def check_knobs(where: str, knobs: dict[str, Any]) -> None:
    """Raise ValueError naming the first knob (``where.KEY``) :func:`knob_value_problem` refuses."""
    for key, value in knobs.items():
        for item in value if isinstance(value, list) else [value]:
            problem = knob_value_problem(key, item)
            if problem:
                raise ValueError(f"{where}.{key} = {short_repr(item)}: {problem}")


# ----------------------------------------------------------------------------------------------------------
# reading the file, validating a section

MERGE_TAG = "tag:yaml.org,2002:merge"
MICRO_PROFILE = "configs/micro.yaml"
# the profiles nest 5 levels deep and hold a few hundred values
MAX_DEPTH = 100
MAX_NODES = 100_000


def _dotted(where: str, part: object) -> str:
    return f"{where}.{part}" if where else str(part)


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, except that a key given twice in one mapping is an error, that floats
    are YAML 1.2's (``1e-3`` too), and that a document nested deeper than ``MAX_DEPTH`` levels or whose
    aliases expand past ``MAX_NODES`` values is an error (PyYAML would overflow the stack composing the
    first, and anything that walks the second, validation or an error message, would never finish)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        # composing recurses once per level: count the levels before Python's own limit is reached
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise ComposerError(
                    problem=f"line {line}: nested deeper than {MAX_DEPTH} levels; allowed: {MAX_DEPTH} at "
                    "most"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node)
        # checked on the composed nodes, before construction: PyYAML expands `<<` merges by rewriting the
        # merged mapping nodes in place, after which a legitimate override looks like a duplicate
        stack: list[tuple[yaml.Node, str]] = [(node, "")]
        seen: set[yaml.Node] = set()
        while stack:
            current, where = stack.pop()
            if current in seen:  # an alias shares its anchor's node (and may even contain itself)
                continue
            seen.add(current)
            if isinstance(current, yaml.MappingNode):
                stack.extend(self._unique_children(current, where))
            elif isinstance(current, yaml.SequenceNode):
                stack.extend((item, _dotted(where, i)) for i, item in enumerate(current.value))
        return super().construct_document(node)

    def _unique_children(self, mapping: yaml.MappingNode, where: str) -> list[tuple[yaml.Node, str]]:
        """The values of ``mapping`` with their dotted keys; raise if one key is given twice."""
        first_line: dict[Any, int] = {}
        children = []
        for key_node, value_node in mapping.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                # merges may override; a non-scalar key cannot be hashed, and construction says so
                children.append((value_node, where))
                continue
            key = self.construct_object(key_node)
            dotted = _dotted(where, key)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise ConstructorError(
                    problem=f"line {line}: key {dotted} is given twice, first on line {first_line[key]}; "
                    "allowed: each key once per mapping"
                )
            first_line[key] = line
            children.append((value_node, dotted))
        return children


def _check_expansion(root: yaml.Node) -> None:
    """Raise unless the document under ``root``, every alias expanded, holds at most ``MAX_NODES`` values
    nested at most ``MAX_DEPTH`` deep (a node that contains itself expands without end).

    An alias is its anchor's node object, so the composed document is a graph whose size stays small while
    its expansion grows exponentially ("billion laughs"); sizes and depths are summed over that graph,
    each node once, without recursion.
    """
    size: dict[yaml.Node, int] = {}
    depth: dict[yaml.Node, int] = {}
    open_nodes: set[yaml.Node] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if children_done:
            open_nodes.discard(node)
            size[node] = 1 + sum(size[child] for child in children)
            depth[node] = 1 + max((depth[child] for child in children), default=0)
            line = node.start_mark.line + 1
            if size[node] > MAX_NODES:
                raise ConstructorError(
                    problem=f"line {line}: more than {MAX_NODES} values once its aliases are expanded; "
                    f"allowed: {MAX_NODES} at most"
                )
            if depth[node] > MAX_DEPTH:
                raise ConstructorError(
                    problem=f"line {line}: nested deeper than {MAX_DEPTH} levels once its aliases are "
                    f"expanded; allowed: {MAX_DEPTH} at most"
                )
            continue
        if node in size:
            continue
        if node in open_nodes:
            raise ConstructorError(
                problem=f"line {node.start_mark.line + 1}: an alias refers to a node that contains it; "
                "allowed: aliases of finished nodes"
            )
        open_nodes.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child in children if child not in size)


# YAML 1.2 floats: an exponent needs neither a dot nor a sign (PyYAML's YAML 1.1 rule reads `1e-3` as text)
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str) -> Any:
    """``text`` read as the params file is (:class:`UniqueKeyLoader`); raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=UniqueKeyLoader)


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> Any:
    """:func:`parse_yaml`, remembered: a run reads one file many times (every section, every stage's
    outputs), and PyYAML takes a good part of a second for a profile. Callers get a deep copy."""
    return parse_yaml(text)


def yaml_problem(err: yaml.YAMLError) -> str:
    """What a YAML error says went wrong, and on which line, cut to a readable length."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if problem and mark is not None:
        text = f"line {mark.line + 1}: {problem}"
    else:
        text = problem or (str(err).splitlines() or [type(err).__name__])[0]
    return short_repr(text, limit=200, quote=False)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path}: params file not found (pass --params FILE or create params.yaml)")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); allowed: a UTF-8 "
            "YAML file"
        ) from None
    try:
        data = copy.deepcopy(_parsed(text)) or {}
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({yaml_problem(err)})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def missing_section(path: Path, name: str) -> UserError:
    return UserError(
        f"{path}: no {name!r} section (every stage reads its own section; see {MICRO_PROFILE} for a "
        "complete example)"
    )


# YAML's names for what it gave, so `'4'` or `true` in a number's place reads as what it is
YAML_KINDS: dict[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    list: "a list",
    dict: "a mapping",
    type(None): "null",
}
# a number that YAML gave as text, because it was quoted
NUMBER_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


# reprs cut while they are made: a value may be huge (a list of a million items), and only its start is read
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 3, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40
REPR_LIMIT = 80


def short_repr(value: Any, *, limit: int = REPR_LIMIT, quote: bool = True) -> str:
    """``repr(value)`` (``str`` if not ``quote``) on one line of at most ``limit`` characters, cut by "…"."""
    text = _REPR.repr(value) if quote else str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _got(error_type: str, value: Any) -> str:
    """What YAML gave instead of the expected type, in YAML's words, and how to write a number as one."""
    got = f"got {YAML_KINDS.get(type(value), type(value).__name__)}"
    if error_type in {"int_type", "float_type"} and isinstance(value, str) and NUMBER_TEXT.fullmatch(value):
        return f"{got} (write numbers unquoted)"
    return got


def _one_line(path: Path, section: str, schema: type[Section], err: ValidationError) -> str:
    first = err.errors()[0]
    key = short_repr(".".join(str(part) for part in (section, *first["loc"])), limit=120, quote=False)
    if first["type"] == "extra_forbidden":
        allowed = ", ".join(schema.model_fields) if len(first["loc"]) == 1 else None
        hint = f"unknown key (allowed: {allowed})" if allowed else "unknown key"
        return f"{path}: {key}: {hint}"
    msg = short_repr(first["msg"].removeprefix("Value error, "), limit=400, quote=False)
    if first["type"].endswith("_type"):
        msg = f"{msg}, {_got(first['type'], first['input'])}"
    if first["type"] in {"missing"} or first["loc"] == ():
        return f"{path}: {key}: {msg}"
    return f"{path}: {key} = {short_repr(first['input'])}: {msg}"


def validate_section(name: str, raw: Any, path: Path = Path("params.yaml"), *, schema: type[S]) -> S:
    """Validate the mapping ``raw`` (``None``: all defaults) as section ``name`` with its ``schema``; raise
    :class:`UserError` (one line) if bad. A ``name`` that is no section is refused before ``schema`` is
    used."""
    if name not in SECTION_NAMES:
        raise UserError(f"{path}: unknown section {name!r} (allowed: {', '.join(SECTION_NAMES)})")
    try:
        return schema.model_validate(raw if raw is not None else {})
    except ValidationError as err:
        raise UserError(_one_line(path, name, schema, err)) from None


def load_section(name: str, path: str | os.PathLike = "params.yaml", *, schema: type[S]) -> S:
    """Read ``path`` and return its section ``name`` validated by ``schema``; the section must be present
    (defaults fill absent keys)."""
    path = Path(path)
    data = read_yaml(path)
    if name in SECTION_NAMES and name not in data:
        raise missing_section(path, name)
    return validate_section(name, data.get(name), path, schema=schema)
