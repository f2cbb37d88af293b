/* LD_PRELOAD shim for fastt's local clusters.
 *
 * bind(): a bind to the wildcard address binds the loopback address instead. TensorFlow's gRPC
 * server always listens on 0.0.0.0 (or [::]); the worker processes of `fastt cluster up` must
 * be reachable from this machine only.
 *
 * accept(), accept4(): a TCP connection is accepted only from a socket of the worker's own
 * user. TensorFlow's gRPC servers have no authentication: any local user who finds the port
 * could run ops as the worker's user (write its files). On loopback, the peer's socket is in
 * /proc/net/tcp or /proc/net/tcp6 (local port = the peer's port, remote port = ours) with the
 * uid that created it; a connection whose peer is another user's, or cannot be found, is
 * closed at once and the next one is accepted. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static bind_fn real_bind;
  if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  } else if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      /* ::ffff:127.0.0.1 on a dual-stack socket: IPv4 loopback only. */
      static const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
                                               127, 0, 0, 1};
      memcpy(&a.sin6_addr, mapped, sizeof mapped);
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  }
  return real_bind(fd, addr, len);
}

static int port_of(const struct sockaddr_storage *a) {
  if (a->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)a)->sin_port);
  if (a->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
  return -1;
}

/* The uid of the socket in `table` whose local port is `peer` and remote port `self`; -1. */
static long uid_in(const char *table, int peer, int self) {
  FILE *f = fopen(table, "r");
  if (!f) return -1;
  char line[512];
  long uid = -1;
  if (!fgets(line, sizeof line, f)) { fclose(f); return -1; } /* the header */
  while (fgets(line, sizeof line, f)) {
    char local[64], remote[64];
    unsigned st;
    long u;
    if (sscanf(line, " %*d: %63s %63s %x %*s %*s %*s %ld", local, remote, &st, &u) != 4)
      continue;
    const char *lp = strrchr(local, ':'), *rp = strrchr(remote, ':');
    if (!lp || !rp) continue;
    unsigned lport, rport;
    if (sscanf(lp + 1, "%x", &lport) != 1 || sscanf(rp + 1, "%x", &rport) != 1) continue;
    if ((int)lport == peer && (int)rport == self) { uid = u; break; }
  }
  fclose(f);
  return uid;
}

/* Whether connection `fd` (just accepted) comes from a socket of this process's user; a
 * connection that is not TCP over IP is left alone. */
static int same_user(int fd) {
  struct sockaddr_storage peer, self;
  socklen_t pl = sizeof peer, sl = sizeof self;
  if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 ||
      getsockname(fd, (struct sockaddr *)&self, &sl) != 0)
    return 1;
  if (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) return 1;
  int p = port_of(&peer), s = port_of(&self);
  long uid = uid_in("/proc/net/tcp", p, s);
  if (uid < 0) uid = uid_in("/proc/net/tcp6", p, s);
  return uid >= 0 && (uid_t)uid == getuid();
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  static accept4_fn real_accept4;
  if (!real_accept4) real_accept4 = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
  for (;;) {
    socklen_t given = len ? *len : 0;
    int c = real_accept4(fd, addr, len, flags);
    if (c < 0 || same_user(c)) return c;
    close(c); /* another user's connection: refused; the next one, or EAGAIN */
    if (len) *len = given;
  }
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
  static accept_fn real_accept;
  if (!real_accept) real_accept = (accept_fn)dlsym(RTLD_NEXT, "accept");
  for (;;) {
    socklen_t given = len ? *len : 0;
    int c = real_accept(fd, addr, len);
    if (c < 0 || same_user(c)) return c;
    close(c);
    if (len) *len = given;
  }
}
