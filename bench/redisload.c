/*
 * redisload: a tiny closed-loop load generator for the Redis side of the
 * fencepost benchmark (bench/run.py compiles and runs it).
 *
 * redis-benchmark sends one command shape over and over, with independent
 * random numbers in each command, so it cannot run "SET NX a key, then delete
 * *that* key if it still holds my token". This program can: like wrk with one
 * connection per thread, every connection runs its own request sequence, and
 * the next command is sent as soon as the previous reply arrives.
 *
 *   redisload PORT CONNECTIONS SECONDS WORKLOAD NONCE SHA_DEL SHA_PEXPIRE SHA_SEM_ACQ SHA_SEM_REL
 *
 * WORKLOAD: a  SET k tok NX PX 30000, then EVALSHA compare-and-delete (k, tok)
 *           b  SET k tok PX 60000 once, then EVALSHA compare-and-pexpire forever
 *           c  SET hot tok NX PX 30000 on one key; compare-and-delete when granted
 *           d  EVALSHA semaphore acquire (limit = CONNECTIONS), then release
 * Prints one line: BENCH_RESULT {json} (latencies per command, microseconds).
 * Only 127.0.0.1. Single-threaded epoll; no dependencies beyond libc.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HIST_MAX_US 2000000 /* 1 us buckets up to 2 s; slower replies land in the last */

enum step { ACQUIRE, RELEASE, RENEW };

struct conn {
    int fd, id;
    enum step step;
    uint64_t seq, started_us;
    char key[96], tok[40];
    char wbuf[512];
    size_t wlen, woff;
    char rbuf[4096];
    size_t rlen;
};

static const char *nonce, *sha_del, *sha_pexpire, *sha_sem_acq, *sha_sem_rel;
static char workload;
static int nconns;
static uint32_t *hist;
static uint64_t ops, ok, unexpected, granted, denied, max_us, sum_us;
static int shown;

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Append one RESP array command built from argv to c->wbuf. */
static void command(struct conn *c, int argc, const char **argv) {
    size_t n = (size_t)snprintf(c->wbuf, sizeof c->wbuf, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++)
        n += (size_t)snprintf(c->wbuf + n, sizeof c->wbuf - n, "$%zu\r\n%s\r\n", strlen(argv[i]),
                              argv[i]);
    c->wlen = n;
    c->woff = 0;
}

static void new_token(struct conn *c) {
    snprintf(c->tok, sizeof c->tok, "%08lx%08lx%08lx", (unsigned long)random(),
             (unsigned long)random(), (unsigned long)random());
}

static void next_command(struct conn *c) {
    char limit[16], numkeys[] = "1";
    snprintf(limit, sizeof limit, "%d", nconns);
    switch (workload) {
    case 'a':
        if (c->step == ACQUIRE) {
            c->seq++;
            snprintf(c->key, sizeof c->key, "a-%s-%d-%llu", nonce, c->id, (unsigned long long)c->seq);
            new_token(c);
            const char *argv[] = {"SET", c->key, c->tok, "NX", "PX", "30000"};
            command(c, 6, argv);
        } else {
            const char *argv[] = {"EVALSHA", sha_del, numkeys, c->key, c->tok};
            command(c, 5, argv);
        }
        break;
    case 'b':
        if (c->step == ACQUIRE) {
            snprintf(c->key, sizeof c->key, "b-%s-%d", nonce, c->id);
            new_token(c);
            const char *argv[] = {"SET", c->key, c->tok, "NX", "PX", "60000"};
            command(c, 6, argv);
        } else {
            const char *argv[] = {"EVALSHA", sha_pexpire, numkeys, c->key, c->tok, "60000"};
            command(c, 6, argv);
        }
        break;
    case 'c':
        if (c->step == ACQUIRE) {
            snprintf(c->key, sizeof c->key, "hot-%s", nonce);
            new_token(c);
            const char *argv[] = {"SET", c->key, c->tok, "NX", "PX", "30000"};
            command(c, 6, argv);
        } else {
            const char *argv[] = {"EVALSHA", sha_del, numkeys, c->key, c->tok};
            command(c, 5, argv);
        }
        break;
    case 'd':
        snprintf(c->key, sizeof c->key, "pool-%s", nonce);
        if (c->step == ACQUIRE) {
            new_token(c);
            const char *argv[] = {"EVALSHA", sha_sem_acq, numkeys, c->key, c->tok, limit, "30000"};
            command(c, 7, argv);
        } else {
            const char *argv[] = {"EVALSHA", sha_sem_rel, numkeys, c->key, c->tok};
            command(c, 5, argv);
        }
        break;
    }
}

/* Length of the first complete RESP reply in buf, 0 if incomplete. */
static size_t reply_len(const char *buf, size_t len) {
    const char *eol = memmem(buf, len, "\r\n", 2);
    if (!eol) return 0;
    size_t line = (size_t)(eol - buf) + 2;
    if (buf[0] == '$') {
        long n = strtol(buf + 1, NULL, 10);
        if (n < 0) return line;
        return len >= line + (size_t)n + 2 ? line + (size_t)n + 2 : 0;
    }
    if (buf[0] == '*') {
        long n = strtol(buf + 1, NULL, 10);
        size_t off = line;
        for (long i = 0; i < n; i++) {
            size_t sub = reply_len(buf + off, len - off);
            if (!sub) return 0;
            off += sub;
        }
        return off;
    }
    return line;
}

static void bad_reply(const char *what, const char *buf, size_t len) {
    unexpected++;
    if (shown++ < 3) fprintf(stdout, "unexpected: %s %.*s\n", what, (int)(len > 200 ? 200 : len), buf);
}

/* Judge one reply and move the connection to its next step. */
static void handle_reply(struct conn *c, const char *buf, size_t len) {
    int is_ok = len >= 3 && memcmp(buf, "+OK", 3) == 0;
    int is_nil = len >= 3 && memcmp(buf, "$-1", 3) == 0;
    int is_one = len >= 2 && memcmp(buf, ":1", 2) == 0;
    int is_zero = len >= 2 && memcmp(buf, ":0", 2) == 0;
    switch (workload) {
    case 'a':
        if (c->step == ACQUIRE) {
            if (is_ok) { ok++; c->step = RELEASE; } else bad_reply("acquire", buf, len);
        } else {
            if (is_one) ok++; else bad_reply("release", buf, len);
            c->step = ACQUIRE;
        }
        break;
    case 'b':
        if (c->step == ACQUIRE) {
            if (is_ok) { ok++; c->step = RENEW; } else bad_reply("acquire", buf, len);
        } else if (is_one) ok++;
        else bad_reply("renew", buf, len);
        break;
    case 'c':
        if (c->step == ACQUIRE) {
            if (is_ok) { ok++; granted++; c->step = RELEASE; }
            else if (is_nil) { ok++; denied++; }
            else bad_reply("acquire", buf, len);
        } else {
            if (is_one) ok++; else bad_reply("release", buf, len);
            c->step = ACQUIRE;
        }
        break;
    case 'd':
        if (c->step == ACQUIRE) {
            if (is_one) { ok++; granted++; c->step = RELEASE; }
            else if (is_zero) { ok++; denied++; }
            else bad_reply("acquire", buf, len);
        } else {
            if (is_one) ok++; else bad_reply("release", buf, len);
            c->step = ACQUIRE;
        }
        break;
    }
}

static int flush(struct conn *c) {
    while (c->woff < c->wlen) {
        ssize_t n = write(c->fd, c->wbuf + c->woff, c->wlen - c->woff);
        if (n < 0 && errno != EAGAIN) return -1;
        if (n < 0) { usleep(50); continue; } /* socket buffer full: not seen on loopback */
        c->woff += (size_t)n;
    }
    return 0;
}

static void send_next(struct conn *c) {
    next_command(c);
    c->started_us = now_us();
    if (flush(c) < 0) { perror("write"); exit(2); }
}

static uint64_t percentile(double p) {
    uint64_t want = (uint64_t)((double)ops * p / 100.0), seen = 0;
    if (want == 0) want = 1;
    for (uint32_t us = 0; us <= HIST_MAX_US; us++) {
        seen += hist[us];
        if (seen >= want) return us;
    }
    return HIST_MAX_US;
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: %s PORT CONNECTIONS SECONDS WORKLOAD NONCE SHA_DEL SHA_PEXPIRE "
                        "SHA_SEM_ACQ SHA_SEM_REL\n", argv[0]);
        return 64;
    }
    int port = atoi(argv[1]);
    nconns = atoi(argv[2]);
    double seconds = atof(argv[3]);
    workload = argv[4][0];
    nonce = argv[5];
    sha_del = argv[6];
    sha_pexpire = argv[7];
    sha_sem_acq = argv[8];
    sha_sem_rel = argv[9];
    if (nconns < 1 || nconns > 4096 || seconds <= 0 || !strchr("abcd", workload)) return 64;
    srandom((unsigned)(now_us() ^ (uint64_t)getpid()));
    hist = calloc(HIST_MAX_US + 1, sizeof *hist);
    struct conn *conns = calloc((size_t)nconns, sizeof *conns);
    int ep = epoll_create1(0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    for (int i = 0; i < nconns; i++) {
        struct conn *c = &conns[i];
        c->id = i + 1;
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0) { perror("connect"); return 2; }
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    }
    uint64_t start = now_us(), deadline = start + (uint64_t)(seconds * 1e6);
    for (int i = 0; i < nconns; i++) send_next(&conns[i]);
    struct epoll_event events[256];
    while (now_us() < deadline) {
        int timeout_ms = (int)((deadline - now_us()) / 1000) + 1;
        int n = epoll_wait(ep, events, 256, timeout_ms);
        for (int e = 0; e < n; e++) {
            struct conn *c = events[e].data.ptr;
            ssize_t got = read(c->fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen);
            if (got == 0) { fprintf(stderr, "redis closed a connection\n"); return 2; }
            if (got < 0) {
                if (errno == EAGAIN) continue;
                perror("read");
                return 2;
            }
            c->rlen += (size_t)got;
            size_t len = reply_len(c->rbuf, c->rlen);
            if (!len) continue;
            uint64_t took = now_us() - c->started_us;
            if (now_us() > deadline) break;
            ops++;
            sum_us += took;
            if (took > max_us) max_us = took;
            hist[took > HIST_MAX_US ? HIST_MAX_US : took]++;
            if (c->rbuf[0] == '-') bad_reply("error", c->rbuf, len);
            else handle_reply(c, c->rbuf, len);
            memmove(c->rbuf, c->rbuf + len, c->rlen - len);
            c->rlen -= len;
            send_next(c);
        }
    }
    double elapsed = (double)(now_us() - start);
    printf("BENCH_RESULT {\"requests\": %llu, \"duration_us\": %.0f, \"p50_us\": %llu, "
           "\"p90_us\": %llu, \"p99_us\": %llu, \"max_us\": %llu, \"mean_us\": %.1f, \"ok\": %llu, "
           "\"unexpected\": %llu, \"granted\": %llu, \"denied\": %llu, \"socket_errors\": 0, "
           "\"non_2xx_3xx\": 0}\n",
           (unsigned long long)ops, elapsed, (unsigned long long)percentile(50),
           (unsigned long long)percentile(90), (unsigned long long)percentile(99),
           (unsigned long long)max_us, ops ? (double)sum_us / (double)ops : 0.0,
           (unsigned long long)ok, (unsigned long long)unexpected, (unsigned long long)granted,
           (unsigned long long)denied);
    return 0;
}
