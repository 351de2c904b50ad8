"""What each quarantine / drop reason means for the user: the fix, in one line.

Used where a build tells its outcome (the summary, the bad-fraction failure), so a
reason never reaches the user without what to do about it.
"""

from __future__ import annotations

FIXES = {
    "media_outside_root": "a record names a file outside the dataset root: --allow-outside-media-root accepts it",
    "missing_image": "files are not where records say: check the paths, or set --media-root",
    "missing_audio": "files are not where records say: check the paths, or set --media-root",
    "bad_media_path": "a media path cannot name a file (NUL byte, too long, symlink loop): fix the records",
    "corrupt_image": "damaged image files: repair or remove them (quarantine.jsonl names each)",
    "corrupt_audio": "damaged audio files: repair or remove them (quarantine.jsonl names each)",
    "unsupported_image": "an image the policy cannot resize (aspect ratio over 200?): crop it, or drop the record",
    "audio_too_short": "clips too short for the encoder to give one position: drop or pad them",
    "audio_too_long": "clips longer than the audio encoder's window, dropped by --long-audio drop: cut them into pieces",
    "missing_video": "files are not where records say: check the paths, or set --media-root",
    "corrupt_video": "damaged video files: re-encode or remove them (quarantine.jsonl names each)",
    "no_video_stream": "files listed as video hold no video stream: list them as audio / image, or drop them",
    "video_too_large": "video frames over 89 Mpixels, or over 2^40 pixels in all: downscale or cut them",
    "media_over_memory": "a record's audio would need over 4 GiB when its row is collated (hours of audio the encoder "
                         "keeps whole): cut it into shorter clips",
    "media_too_long": "audio / video over 6 hours (or 2^20 frames): cut them into clips, or check they are not damaged",
    "bad_frame_rate": "a video or frame list states an implausible rate (not 0.01-1000 fps): re-encode it, or fix the fps",
    "bad_sample_rate": "audio at an implausible sample rate (not 1 kHz-768 kHz): resample it",
    "unknown_format": "record shapes packer does not recognise: see the README's Inputs, or force --format",
    "wrong_format": "records without the key field of the forced --format: drop --format to auto-detect",
    "malformed_json": "lines that are not JSON: fix the lines quarantine.jsonl names",
    "not_an_object": "lines that are JSON but not an object: each line must be one record {...}",
    "wrong_type": "a field of the wrong type (quarantine.jsonl names which): fix the records",
    "empty_text": "records with no text: drop them",
    "empty_conversation": "conversations without turns: drop them",
    "unknown_role": "a turn role packer does not know: use system / user / assistant / tool (or human / gpt)",
    "invalid_text": "text with lone surrogates (not valid Unicode): fix the records' encoding",
    "invalid_id": "an id that is not valid Unicode: fix or drop the id",
    "number_too_large": "an integer over 4,300 digits: store it as a string",
    "nesting_too_deep": "JSON nested too deep to parse: flatten the record",
    "reserved_token_in_text": "a media token packer reserves reached a trained position: report it (a bug)",
    "special_token_in_text": "a control token typed in a message that this tokenizer cannot hold as plain text: remove it",
    "private_marker_in_text": "a record typing U+F0000 / U+F0001 and a control token: remove the invisible U+F0000 / U+F0001",
    "template_not_aligned": "a chat template whose turns cannot be told apart, on a record with many turns: split it",
    "unsupported_video": "a video the family's processor cannot take (1 frame? aspect ratio over 200?): drop it",
    "incompatible_media": "items the model class cannot take in one call (LLaVA-OneVision: videos of different frame "
                          "counts in one record; its processor cannot stack them either): split the record",
    "unsupported_media_ref": "an s3:// / gs:// ... media URL in a local dataset: give paths relative to the dataset, or "
                             "http(s):// or data: URLs",
    "media_fetch_failed": "http(s):// media the server refused or failed (quarantine.jsonl names the URL and the status): "
                          "fix the URLs, or retry when the server is up",
    "media_fetch_timeout": "http(s):// media that did not arrive within the timeout, after retries: retry, or copy them "
                           "next to the dataset",
    "media_too_large": "a medium (URL body, data: URL) over its byte limit (docs/media.md): shrink it, or drop the record",
    "bad_data_url": "data: URLs that hold no medium (not base64, broken, empty): fix the records",
    "internal_error": "a packer bug met this record: please report it with the quarantine entry",
    "invalid_utf8": "lines that are not UTF-8: re-encode the file",
    "line_too_long": "lines over --max-line-bytes: raise it if they are genuine",
    "image_count_mismatch": "the number of <image> tags differs from the listed files",
    "audio_count_mismatch": "the number of <audio> tags differs from the listed files",
    "media_placeholder_mismatch": "a placeholder string typed in the text: remove it, or change --image-tag / --image-token",
    "no_encoder": "media of a kind the pipeline's modalities leave out: use a pipeline that encodes it",
    "sharegpt_tool_calls": "a ShareGPT from / value turn with tool_calls / tool_call_id: write the record as messages "
                           "(role / content), which carry them",
    "tools_not_rendered": "tool calls / tools the chat template cannot render or leaves out: use a tool-calling template",
    "template_error": "the chat template failed on these records: check their roles and turns",
    "template_too_slow": "the chat template ran past --template-max-steps on these records: fix the template, or raise it",
    "template_output_too_long": "the chat template built more than --template-max-chars: fix the template, or raise it",
    "no_trainable_tokens": "records with nothing to train (no assistant turn?)",
    "oversize": "samples longer than --max-length: raise it, or --oversize truncate / split",
    "media_over_capacity": "a media item longer than a row: raise --max-length",
    "over_media_cap": "more media than --max-images / --max-audio / --max-media allow in a row: raise the cap",
    "nothing_trainable": "samples (or pieces) with no trained token left after the cut: raise --max-length",
    "split_lost_media": "split pieces that lost the media their text follows: raise --max-length",
    "preference_record": "preference / multi-response records in an SFT build: pass --preference pairs or tree",
    "preference_prompt_diverges": "the chat template renders the prompt differently for each response: fix the template",
    "label_not_boolean": "a KTO 'label' that is not the JSON boolean true / false (\"false\", 0, null): fix the records",
    "label_without_completion": "a boolean 'label' on a record that is not KTO's prompt / completion / label: give it "
                                "that shape, or drop 'label'",
    "ambiguous_record": "records holding the responses of several shapes (chosen / rejected, responses, completion), or a "
                        "conversation beside them: keep one shape's fields, or force --format",
    "media_in_string_preference": "a string preference prompt with media: give it as messages, or --preference-strings chat",
    "media_in_response": "a response holds an image / clip / video: media belong to the shared prompt",
    "preference_too_long": "a preference record (all its responses) longer than --max-length: raise it",
}
NOT_BAD = ("no_encoder", "audio_too_long")  # declared choices (modalities, --long-audio drop): not counted against
# --max-bad-fraction


def fix(reason: str) -> str:
    return FIXES.get(reason, "see quarantine.jsonl / dropped.jsonl for each record")


def top(counts: dict[str, int], n: int = 3, *, with_fix: bool = True) -> str:
    """``missing_image 10 (fix), oversize 5 (fix)`` for the ``n`` most frequent reasons."""
    ranked = sorted(((c, r) for r, c in counts.items() if c), key=lambda cr: (-cr[0], cr[1]))[:n]
    return "; ".join(f"{r} {c:,}" + (f" ({fix(r)})" if with_fix else "") for c, r in ranked)
