"""GAN style: a generator and a discriminator, two optimizers over their own variable lists,
run alternately (two training signatures); noise comes from numpy through a placeholder."""
import argparse
import random
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/gan_two_optimizers")
args = parser.parse_args()

random.seed(13)  # tf.layers draws its initializers' seeds from Python's random
np.random.seed(13)
tf1.set_random_seed(13)
rng = np.random.RandomState(13)
real_data = (rng.randn(512, 8) * 0.5 + 2.0).astype(np.float32)
z = tf1.placeholder(tf.float32, [None, 4], name="z")
real = tf1.placeholder(tf.float32, [None, 8], name="real")


def generator(noise):
    with tf1.variable_scope("generator"):
        h = tf1.layers.dense(noise, 16, activation=tf.nn.relu)
        return tf1.layers.dense(h, 8)


def discriminator(sample, reuse=False):
    with tf1.variable_scope("discriminator", reuse=reuse):
        h = tf1.layers.dense(sample, 16, activation=tf.nn.leaky_relu)
        return tf1.layers.dense(h, 1)


fake = generator(z)
d_real, d_fake = discriminator(real), discriminator(fake, reuse=True)
xent = tf.nn.sigmoid_cross_entropy_with_logits
d_loss = tf.reduce_mean(xent(labels=tf.ones_like(d_real), logits=d_real)) + \
    tf.reduce_mean(xent(labels=tf.zeros_like(d_fake), logits=d_fake))
g_loss = tf.reduce_mean(xent(labels=tf.ones_like(d_fake), logits=d_fake))
d_vars = tf1.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES, "discriminator")
g_vars = tf1.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES, "generator")
d_step = tf1.train.AdamOptimizer(1e-3, beta1=0.5).minimize(d_loss, var_list=d_vars)
g_step = tf1.train.AdamOptimizer(1e-3, beta1=0.5).minimize(g_loss, var_list=g_vars)
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for it in range(100):
        k = it % 8
        noise = rng.uniform(-1, 1, (64, 4)).astype(np.float32)
        _, dl = sess.run([d_step, d_loss], {z: noise, real: real_data[k * 64:(k + 1) * 64]})
        _, gl = sess.run([g_step, g_loss], {z: noise})
        if (it + 1) % 50 == 0:
            print(f"iter {it + 1}: d_loss {dl:.5f} g_loss {gl:.5f}")
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "gan.ckpt")))
    print("final loss:", dl + gl)
