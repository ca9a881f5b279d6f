from minitext.lists import chunk, dedupe, flatten, rotate


def test_chunk():
    assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunk([], 3) == []
    assert chunk([1, 2], 5) == [[1, 2]]


def test_flatten():
    assert flatten([[1, 2], [3], []]) == [1, 2, 3]
    assert flatten([]) == []


def test_dedupe():
    assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]
    assert dedupe(["a", "a"]) == ["a"]
    assert dedupe([]) == []


def test_rotate():
    assert rotate([1, 2, 3, 4], 1) == [2, 3, 4, 1]
    assert rotate([1, 2, 3], 4) == [2, 3, 1]
    assert rotate((1, 2, 3), 2) == (3, 1, 2)
    assert rotate([], 3) == []
