"""Reads TensorBoard event files in a directory with TensorBoard's own reader.

Prints one `tag step value` line per scalar, value in repr precision. Tags may contain
spaces, so consumers should split each line from the right (rsplit(" ", 2)). Used by
tests/train/test_tensorboard_writer.cpp to check our writer against the reference reader.
"""
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: read_tensorboard.py <log_dir>")
    # size_guidance 0 = keep every scalar; the default reservoir would subsample.
    acc = event_accumulator.EventAccumulator(
        sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    for tag in sorted(acc.Tags()["scalars"]):
        for event in acc.Scalars(tag):
            print(f"{tag} {event.step} {event.value!r}")


if __name__ == "__main__":
    main()
