"""serving/text.py's TextStream, the incremental detokenizer, on inputs whose answer is known: the byte stand-in
tokenizer makes each UTF-8 byte one token, so a character split over tokens and a stop string split over
chunks are easy to build."""

import pytest

from chunkbench.serving.text import ByteTokenizer, TextStream, chat_prompt_ids

TOKENIZER = ByteTokenizer()


def stream_all(text: str, stop=(), include_stop=False) -> tuple[list[str], TextStream, int]:
    """Push `text` byte by byte, taking what may be sent after each; the pieces, the stream, tokens used."""
    stream = TextStream(TOKENIZER, TOKENIZER.encode("prompt "), list(stop), include_stop)
    pieces, used = [], 0
    for token in TOKENIZER.encode(text):
        used += 1
        if stream.push(token):
            break
    else:
        stream.finish()
    pieces.append(stream.take(final=True))  # the rest
    return pieces, stream, used


def test_a_character_split_over_tokens_comes_out_whole():
    stream = TextStream(TOKENIZER, [], [])
    out = []
    for token in "é€".encode():  # 2 + 3 bytes
        stream.push(token)
        out.append(stream.take(final=False))
    assert out == ["", "é", "", "", "€"]  # nothing half-made, no replacement character


@pytest.mark.parametrize(
    "text, stop, include, expected, used",
    [
        ("hello world, stop here", ["stop"], False, "hello world, ", 17),
        ("hello world, stop here", ["stop"], True, "hello world, stop", 17),
        ("hello world", ["xyz"], False, "hello world", 11),
        ("aaab", ["ab", "aab"], False, "aa", 4),  # as vLLM: the first stop listed that the new text completes
        ("na€ve", ["€"], False, "na", 5),  # found once the character is whole
    ],
)
def test_stop_strings_end_the_text_where_they_begin(text, stop, include, expected, used):
    pieces, stream, consumed = stream_all(text, stop, include)
    assert "".join(pieces) == expected and consumed == used
    assert stream.stop_reason == (None if expected == text else next(s for s in stop if s in text))


def test_streaming_holds_back_what_may_start_a_stop_string():
    stream = TextStream(TOKENIZER, [], ["STOP"])
    sent = []
    for token in TOKENIZER.encode("abcSTO"):
        stream.push(token)
        sent.append(stream.take(final=False))
    assert "".join(sent) == "abc"  # "STO" could become "STOP": held back, never sent and then taken back
    assert stream.take(final=True) == "STO"  # the request ended without it: the held text goes out


def test_the_byte_stand_in_chat_prompt():
    ids = chat_prompt_ids(TOKENIZER, [{"role": "user", "content": "hi"}])
    assert TOKENIZER.decode(ids) == "user: hi\nassistant: "
