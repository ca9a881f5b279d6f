"""List helpers."""


def chunk(items, size):
    """`items` in consecutive lists of `size` (the last may be shorter)."""
    if size <= 0:
        raise ValueError("size must be positive")
    return [items[i:i + size] for i in range(0, len(items), size)]


def flatten(nested):
    """One level of nesting removed: [[1, 2], [3]] -> [1, 2, 3]."""
    out = []
    for part in nested:
        out.extend(part)
    return out


def dedupe(items):
    """`items` without repeats, first occurrences kept in order."""
    seen = set()
    out = []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def rotate(items, k):
    """`items` rotated left by `k` places (a tuple stays a tuple)."""
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]
