from planner.words.names import compress_names, join_names


def test_compress_names_is_exact():
    assert compress_names(["a.0", "a.1", "a.2", "a.5", "b", "a.7"]) == ["a.{0..2,5,7}", "b"]
    assert compress_names(["x.3"]) == ["x.3"]
    assert compress_names(["x.1", "x.2"]) == ["x.{1,2}"]
    assert compress_names(["x.03", "x.4"]) == ["x.03", "x.4"]  # a leading zero would not round-trip
    assert join_names([f"l.{i}" for i in range(0, 20, 2)] + ["h"], 1) == "l.{0,2,4,6,8,10,12,14,16,18} and 1 more"
