from packer.ingest.reader import read_lines


def test_bom_crlf_and_blank_lines(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n\r\n   \n{"text": "b"}\r\n\n{"text": "c"}')
    counts = {}
    lines = list(read_lines(path, counts))
    assert [(r.line, r.data) for r in lines] == [(1, b'{"text": "a"}'), (4, b'{"text": "b"}'), (6, b'{"text": "c"}')]
    assert counts == {"blank_lines": 3}


def test_line_numbers_count_every_physical_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"\n".join(b'{"text": "%d"}' % i for i in range(5)) + b"\n")
    assert [r.line for r in read_lines(path)] == [1, 2, 3, 4, 5]
