"""Exceptions raised by qrt."""


class FormatError(ValueError):
    """A .qrt file is malformed, inconsistent or unsupported.

    The message names the problem and where it is (the tensor, node or header
    field). Subclasses ValueError so callers that catch bad input in general
    also catch bad files.
    """
