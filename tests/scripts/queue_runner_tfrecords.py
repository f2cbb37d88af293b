"""The classic TF1 input pipeline: TFRecord files written first, then read back through
string_input_producer, a TFRecordReader, parse_single_example and tf.train.batch, with
queue runners started by tf.train.start_queue_runners and a Coordinator; a small MLP
trained with plain SGD until the epochs run out, in the tutorials' loop (``while not
coord.should_stop()``, ``OutOfRangeError`` ends it). Prints which examples the steps drew."""
import argparse
import hashlib
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/queue_runner_tfrecords")
args = parser.parse_args()
os.makedirs(args.out, exist_ok=True)

rng = np.random.RandomState(1)
files = []
for shard in range(2):
    path = os.path.join(args.out, f"train-{shard}.tfrecord")
    with tf1.python_io.TFRecordWriter(path) as writer:
        for i in range(100):
            index = shard * 100 + i
            x = rng.rand(8).astype(np.float32)
            example = tf1.train.Example(features=tf1.train.Features(feature={
                "index": tf1.train.Feature(int64_list=tf1.train.Int64List(value=[index])),
                "x": tf1.train.Feature(float_list=tf1.train.FloatList(value=x)),
                "y": tf1.train.Feature(int64_list=tf1.train.Int64List(value=[int(x.sum() > 4)])),
            }))
            writer.write(example.SerializeToString())
    files.append(path)

filename_queue = tf1.train.string_input_producer(files, num_epochs=12, shuffle=False)
reader = tf1.TFRecordReader()
_, serialized = reader.read(filename_queue)
features = tf1.parse_single_example(serialized, {
    "index": tf1.FixedLenFeature([], tf.int64),
    "x": tf1.FixedLenFeature([8], tf.float32),
    "y": tf1.FixedLenFeature([], tf.int64)})
index, x, y = tf1.train.batch([features["index"], features["x"], features["y"]],
                              batch_size=16, num_threads=1, capacity=64)

hidden = tf1.layers.dense(x, 32, tf.nn.relu, kernel_initializer=tf1.glorot_uniform_initializer(7))
logits = tf1.layers.dense(hidden, 2, kernel_initializer=tf1.glorot_uniform_initializer(8))
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
train_op = tf1.train.GradientDescentOptimizer(0.5).minimize(loss)
saver = tf1.train.Saver()

seen = []
with tf1.Session() as sess:
    sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
    coord = tf1.train.Coordinator()
    threads = tf1.train.start_queue_runners(sess=sess, coord=coord)
    step = 0
    try:
        while not coord.should_stop():
            _, value, drawn = sess.run([train_op, loss, index])
            seen.extend(drawn.tolist())
            if step % 50 == 0:
                print(f"step {step} loss {value:.5f}")
            step += 1
    except tf.errors.OutOfRangeError:
        print(f"done training: {step} steps, epoch limit reached")
    finally:
        coord.request_stop()
    coord.join(threads)
    counts = np.bincount(np.asarray(seen), minlength=200)
    print(f"batches drawn {step} examples {len(seen)} order "
          f"{hashlib.sha1(np.asarray(seen).tobytes()).hexdigest()[:12]} "
          f"each seen {counts.min()}-{counts.max()} times")
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
