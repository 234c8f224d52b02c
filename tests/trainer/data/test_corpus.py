"""Reading corpora: WikiText and plain text, sentence splitting, and clear errors."""

from __future__ import annotations

import pytest

from trainer.data.corpus import CorpusError, SentenceSplitter, read_documents


def test_wikitext_articles_become_documents(small_corpus):
    documents = read_documents(small_corpus)
    titles = [line for line in small_corpus.read_text().splitlines() if line.startswith(" = ") and not line.startswith(" = =")]
    assert len(documents) == len(titles)
    text = " ".join(s for d in documents for s in d.sentences)
    assert "<unk>" not in text and "[UNK]" in text  # the marker becomes the special token
    assert " @-@ " not in text and " @,@ " not in text
    assert not any(s.startswith("=") for d in documents for s in d.sentences)  # headings are not text


def test_plain_text_documents_are_separated_by_blank_lines(tmp_path):
    (tmp_path / "a.txt").write_text("First doc. It has two sentences.\n\nSecond doc here.\nStill the second doc.\n")
    documents = read_documents(tmp_path)
    assert [d.sentences for d in documents] == [
        ["First doc.", "It has two sentences."],
        ["Second doc here.", "Still the second doc."],
    ]


def test_sentence_splitter_is_not_fooled_by_abbreviations_and_decimals():
    split = SentenceSplitter()
    assert split("Dr. Smith paid $3.50 for it. Then he left.") == ["Dr. Smith paid $3.50 for it.", "Then he left."]
    assert len(split("The U.S. Army arrived at 5 p.m. on Monday . It rained .")) == 2


def test_errors_name_the_path(tmp_path):
    with pytest.raises(CorpusError, match="nothing-here: no such file"):
        read_documents(tmp_path / "nothing-here")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n \n")
    with pytest.raises(CorpusError, match="empty.txt: no text found"):
        read_documents(empty)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"ok\xff\xfe text")
    with pytest.raises(CorpusError, match="binary.txt: not UTF-8"):
        read_documents(binary)
    (tmp_path / "dir").mkdir()
    with pytest.raises(CorpusError, match="dir: directory holds no text files"):
        read_documents(tmp_path / "dir")


def test_unreadable_file(tmp_path, monkeypatch):
    locked = tmp_path / "locked.txt"
    locked.write_text("text")
    real_open = type(locked).open

    def refuse(self, *args, **kwargs):
        if self.name == "locked.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    # Tests run as root in CI, where chmod 000 does not stop reads; refuse the read instead.
    monkeypatch.setattr(type(locked), "open", refuse)
    with pytest.raises(CorpusError, match="locked.txt: permission denied"):
        read_documents(locked)
