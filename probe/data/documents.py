"""How each bundled text is cut into documents.

Documents matter twice: training windows are drawn from documents joined by EOS, and held-out evaluation takes the first
window of each document so that a document bootstrap (docs/definitions.md#document-bootstrap) can resample independent
units. So a document should be a natural unit of the source, long enough to hold a window:

- WikiText-2: one Wikipedia article, cut at top-level `` = Title = `` heading lines with a blank line on each side
  (``= = Section = =`` stays inside; formula lines such as `` = 1 <unk> / s = `` inside a paragraph are not headings).
- Shakespeare: one work (37 plays and 5 poem collections), cut at each title line that is followed by
  ``by William Shakespeare``.
- King James Bible: one book (66). The bundled text has one paragraph per line and no book titles, so books are found by
  their opening words, in canonical order (``KJV_BOOKS``); every opening must be found or loading fails loudly.
- A local text file: chunks separated by one or more blank lines.
"""

from __future__ import annotations

import re

_WIKI_TITLE = re.compile(r"^ = [^=].* = $")


def split_wikitext(text: str) -> list[str]:
    """Articles of a WikiText file (raw lines kept, outer blank lines dropped)."""
    docs, cur = [], []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        blank_around = (i == 0 or not lines[i - 1].strip()) and (i + 1 == len(lines) or not lines[i + 1].strip())
        if _WIKI_TITLE.match(line) and blank_around and any(s.strip() for s in cur):
            docs.append("\n".join(cur).strip("\n "))
            cur = []
        cur.append(line)
    if any(s.strip() for s in cur):
        docs.append("\n".join(cur).strip("\n "))
    return docs


def split_shakespeare(text: str) -> list[str]:
    """One document per work: a title line, a blank line, then ``by William Shakespeare``."""
    lines = text.split("\n")
    starts = [i - 2 for i, s in enumerate(lines) if s.strip() == "by William Shakespeare" and i >= 2]
    if not starts:
        raise ValueError("no 'by William Shakespeare' title lines found; is this the bundled shakespeare.txt?")
    bounds = starts + [len(lines)]
    return ["\n".join(lines[a:b]).strip() for a, b in zip(bounds[:-1], bounds[1:])]


# (book, opening words, which occurrence after the previous book's start). Ezra's first verse repeats the last
# verses of 2 Chronicles word for word, so Ezra is the second occurrence.
KJV_BOOKS = [
    ("Genesis", "In the beginning God created", 0),
    ("Exodus", "Now these [are] the names of the children of Israel", 0),
    ("Leviticus", "And the LORD called unto Moses", 0),
    ("Numbers", "And the LORD spake unto Moses in the wilderness of Sinai", 0),
    ("Deuteronomy", "These [be] the words which Moses spake", 0),
    ("Joshua", "Now after the death of Moses", 0),
    ("Judges", "Now after the death of Joshua", 0),
    ("Ruth", "Now it came to pass in the days when the judges ruled", 0),
    ("1 Samuel", "Now there was a certain man of Ramathaim-zophim", 0),
    ("2 Samuel", "Now it came to pass after the death of Saul", 0),
    ("1 Kings", "Now king David was old", 0),
    ("2 Kings", "Then Moab rebelled against Israel", 0),
    ("1 Chronicles", "Adam, Sheth, Enosh", 0),
    ("2 Chronicles", "And Solomon the son of David was strengthened", 0),
    ("Ezra", "Now in the first year of Cyrus king of Persia", 1),
    ("Nehemiah", "The words of Nehemiah", 0),
    ("Esther", "Now it came to pass in the days of Ahasuerus", 0),
    ("Job", "There was a man in the land of Uz", 0),
    ("Psalms", "Blessed [is] the man that walketh not", 0),
    ("Proverbs", "The proverbs of Solomon the son of David", 0),
    ("Ecclesiastes", "The words of the Preacher", 0),
    ("Song of Solomon", "The song of songs", 0),
    ("Isaiah", "The vision of Isaiah", 0),
    ("Jeremiah", "The words of Jeremiah", 0),
    ("Lamentations", "How doth the city sit solitary", 0),
    ("Ezekiel", "Now it came to pass in the thirtieth year", 0),
    ("Daniel", "In the third year of the reign of Jehoiakim", 0),
    ("Hosea", "The word of the LORD that came unto Hosea", 0),
    ("Joel", "The word of the LORD that came to Joel", 0),
    ("Amos", "The words of Amos", 0),
    ("Obadiah", "The vision of Obadiah", 0),
    ("Jonah", "Now the word of the LORD came unto Jonah", 0),
    ("Micah", "The word of the LORD that came to Micah", 0),
    ("Nahum", "The burden of Nineveh", 0),
    ("Habakkuk", "The burden which Habakkuk", 0),
    ("Zephaniah", "The word of the LORD which came unto Zephaniah", 0),
    ("Haggai", "In the second year of Darius the king", 0),
    ("Zechariah", "In the eighth month, in the second year of Darius", 0),
    ("Malachi", "The burden of the word of the LORD to Israel by Malachi", 0),
    ("Matthew", "The book of the generation of Jesus Christ", 0),
    ("Mark", "The beginning of the gospel of Jesus Christ", 0),
    ("Luke", "Forasmuch as many have taken in hand", 0),
    ("John", "In the beginning was the Word", 0),
    ("Acts", "The former treatise have I made", 0),
    ("Romans", "Paul, a servant of Jesus Christ", 0),
    ("1 Corinthians", "Paul, called [to be] an apostle", 0),
    ("2 Corinthians", "Paul, an apostle of Jesus Christ by the will of God, and Timothy", 0),
    ("Galatians", "Paul, an apostle, ( not of men", 0),
    ("Ephesians", "Paul, an apostle of Jesus Christ by the will of God, to the saints which are at Ephesus", 0),
    ("Philippians", "Paul and Timotheus, the servants of Jesus Christ", 0),
    ("Colossians", "Paul, an apostle of Jesus Christ by the will of God, and Timotheus", 0),
    ("1 Thessalonians", "Paul, and Silvanus, and Timotheus, unto the church of the Thessalonians [which is]", 0),
    ("2 Thessalonians", "Paul, and Silvanus, and Timotheus, unto the church of the Thessalonians in God", 0),
    ("1 Timothy", "Paul, an apostle of Jesus Christ by the commandment of God", 0),
    ("2 Timothy", "Paul, an apostle of Jesus Christ by the will of God, according to the promise", 0),
    ("Titus", "Paul, a servant of God", 0),
    ("Philemon", "Paul, a prisoner of Jesus Christ", 0),
    ("Hebrews", "God, who at sundry times", 0),
    ("James", "James, a servant of God", 0),
    ("1 Peter", "Peter, an apostle of Jesus Christ", 0),
    ("2 Peter", "Simon Peter, a servant", 0),
    ("1 John", "That which was from the beginning", 0),
    ("2 John", "The elder unto the elect lady", 0),
    ("3 John", "The elder unto the wellbeloved Gaius", 0),
    ("Jude", "Jude, the servant of Jesus Christ", 0),
    ("Revelation", "The Revelation of Jesus Christ", 0),
]


def split_kjv(text: str) -> list[str]:
    """One document per book, located by the openings in ``KJV_BOOKS`` (in order)."""
    starts, pos = [], 0
    for book, opening, nth in KJV_BOOKS:
        at = pos - 1
        for _ in range(nth + 1):
            at = text.find(opening, at + 1)
            if at < 0:
                raise ValueError(f"KJV book {book!r} not found (opening {opening!r}); is this the bundled kjv.txt?")
        starts.append(at)
        pos = at + 1
    bounds = starts + [len(text)]
    return [text[a:b].strip() for a, b in zip(bounds[:-1], bounds[1:])]


def split_blank_lines(text: str) -> list[str]:
    """Chunks separated by one or more blank (whitespace-only) lines."""
    return [c.strip("\n") for c in re.split(r"\n[ \t]*\n(?:[ \t]*\n)*", text) if c.strip()]
