"""TensorFlow dtypes by name and enum value, with their element sizes. No TensorFlow import."""
from __future__ import annotations

from fastt.errors import UnknownDtypeError

# (enum value, name as tf.DType.name, bytes per element; None where the size varies per tensor)
_TABLE: tuple[tuple[int, str, int | None], ...] = (
    (1, "float32", 4), (2, "float64", 8), (3, "int32", 4), (4, "uint8", 1), (5, "int16", 2),
    (6, "int8", 1), (7, "string", None), (8, "complex64", 8), (9, "int64", 8), (10, "bool", 1),
    (11, "qint8", 1), (12, "quint8", 1), (13, "qint32", 4), (14, "bfloat16", 2),
    (15, "qint16", 2), (16, "quint16", 2), (17, "uint16", 2), (18, "complex128", 16),
    (19, "float16", 2), (20, "resource", None), (21, "variant", None), (22, "uint32", 4),
    (23, "uint64", 8), (24, "float8_e5m2", 1), (25, "float8_e4m3fn", 1),
    (26, "float8_e4m3fnuz", 1), (27, "float8_e4m3b11fnuz", 1), (28, "float8_e5m2fnuz", 1),
    (29, "int4", 1), (30, "uint4", 1), (31, "int2", 1), (32, "uint2", 1),
    (33, "float4_e2m1fn", 1),
)
_REF_OFFSET = 100  # TensorFlow's DT_FLOAT_REF = 101, ...

_SIZE_BY_NAME: dict[str, int | None] = {name: size for _, name, size in _TABLE}
_NAME_BY_ENUM: dict[int, str] = {value: name for value, name, _ in _TABLE}


def base_name(dtype: str) -> str:
    """``'float32_ref'`` -> ``'float32'``."""
    return dtype[:-4] if dtype.endswith("_ref") else dtype


def is_known(dtype: str) -> bool:
    return base_name(dtype) in _SIZE_BY_NAME


def itemsize(dtype: str, where: str = "") -> int | None:
    """Bytes per element of ``dtype``; None for string, resource and variant tensors.

    Raises UnknownDtypeError naming ``where`` (e.g. the op and output) for unknown names.
    """
    try:
        return _SIZE_BY_NAME[base_name(dtype)]
    except KeyError:
        place = f"{where}: " if where else ""
        raise UnknownDtypeError(f"{place}unknown dtype {dtype!r}") from None


def name_from_enum(value: int, where: str = "") -> str:
    """TensorFlow ``DataType`` enum value -> dtype name (``101`` -> ``'float32_ref'``)."""
    ref = value > _REF_OFFSET
    name = _NAME_BY_ENUM.get(value - _REF_OFFSET if ref else value)
    if name is None:
        place = f"{where}: " if where else ""
        raise UnknownDtypeError(f"{place}unknown dtype enum value {value}")
    return name + "_ref" if ref else name


def is_ref_or_resource(dtype: str) -> bool:
    """Tensors of these dtypes pin their consumer to the producer's device."""
    return dtype.endswith("_ref") or dtype == "resource"
