"""The folder index page (probe.present.page.index_page): links a planted name cannot turn into a script, a host or a
file outside the folder."""


def test_index_links_are_escaped_relative_files_of_the_folder(tmp_path):
    """A name reads as no scheme, host, query or fragment; a link leading out of the folder is left out."""
    import os
    import re

    from probe.present.page import index_page

    names = ["javascript:alert(1)", "a?b#c", "x' onclick='y", os.fsdecode(b"bad\xffname"), "data:text"]
    for name in names:
        (tmp_path / name).write_text("planted")
    (tmp_path / "out").symlink_to("/etc")
    page = index_page(tmp_path)
    hrefs = re.findall(r"href='([^']*)'", page)
    assert len(hrefs) == len(names) and all(h.startswith("./") and ":" not in h for h in hrefs), hrefs
    assert "./javascript%3Aalert%281%29" in hrefs and "./bad%FFname" in hrefs and "./data%3Atext" in hrefs
    assert " onclick=" not in page.replace("x&#x27; onclick=&#x27;y", "")  # the name shown, escaped: no attribute
    assert ">out<" not in page
