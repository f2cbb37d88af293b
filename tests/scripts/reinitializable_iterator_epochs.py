"""The TF 1.4+ tf.data idiom: one reinitializable iterator (Iterator.from_structure) switched
between a training and a validation dataset with make_initializer at every epoch; the epoch
ends on OutOfRangeError, its last batch smaller than the others; validation at another batch
size through the same iterator. disable_v2_behavior: reference variables, v1 control flow."""
import argparse
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_v2_behavior()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/reinitializable_iterator_epochs")
args = parser.parse_args()

tf1.set_random_seed(5)
rng = np.random.RandomState(5)
features = rng.randn(430, 12).astype(np.float32)
targets = (features @ rng.randn(12, 1) + 0.1 * rng.randn(430, 1)).astype(np.float32)
train = tf1.data.Dataset.from_tensor_slices((features[:330], targets[:330]))
train = train.shuffle(330, seed=8).batch(32)  # 10 batches of 32, then one of 10
valid = tf1.data.Dataset.from_tensor_slices((features[330:], targets[330:])).batch(50)
iterator = tf1.data.Iterator.from_structure(tf1.data.get_output_types(train),
                                            tf1.data.get_output_shapes(train))
x, y = iterator.get_next()
train_init = iterator.make_initializer(train)
valid_init = iterator.make_initializer(valid)

hidden = tf1.layers.dense(x, 24, tf.nn.tanh, kernel_initializer=tf1.glorot_normal_initializer(1))
prediction = tf1.layers.dense(hidden, 1, kernel_initializer=tf1.glorot_normal_initializer(2))
loss = tf1.losses.mean_squared_error(y, prediction)
global_step = tf1.train.get_or_create_global_step()
train_op = tf1.train.RMSPropOptimizer(0.01).minimize(loss, global_step=global_step)
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for epoch in range(12):
        sess.run(train_init)
        batches = 0
        while True:
            try:
                _, value = sess.run([train_op, loss])
                batches += 1
            except tf.errors.OutOfRangeError:
                break
        sess.run(valid_init)
        errors = []
        while True:
            try:
                errors.append(sess.run(loss))
            except tf.errors.OutOfRangeError:
                break
        print(f"epoch {epoch} batches {batches} last loss {value:.5f} "
              f"validation {np.mean(errors):.5f}")
    print("batches drawn", sess.run(global_step))
    print(f"test accuracy (validation mse) {np.mean(errors):.4f}")
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
