/* The C ABI of the trellis-fio static library (crates/app/fio/src/ffi.rs).
 * Every function returns an error code and writes a one-line message into
 * err (err_len bytes, NUL-terminated) when it fails; none aborts. */
#ifndef TRELLIS_FIO_H
#define TRELLIS_FIO_H

#include <stddef.h>
#include <stdint.h>

struct trellis_fio_dev;

enum trellis_fio_kind { TRELLIS_FIO_READ = 0, TRELLIS_FIO_WRITE = 1, TRELLIS_FIO_FLUSH = 2 };

/* Connect, identify namespace, disconnect. 0, or -EIO. */
int trellis_fio_probe(const char *filename, uint64_t *size_bytes, uint32_t *block_bytes,
		      char *err, size_t err_len);
/* One controller and one I/O queue of depth commands of at most max_bs bytes; NULL on failure. */
struct trellis_fio_dev *trellis_fio_open(const char *filename, uint32_t depth, uint32_t max_bs,
					 char *err, size_t err_len);
uint64_t trellis_fio_size(const struct trellis_fio_dev *d);
/* 0 queued, 1 busy (reap first), -EINVAL bad I/O, -EIO queue failed. buf stays
 * valid until the I/O's completion is reaped. */
int trellis_fio_submit(struct trellis_fio_dev *d, int kind, uint64_t offset, uint64_t len,
		       void *buf, uint64_t cookie, char *err, size_t err_len);
/* fio's commit: send now, or leave the commands for the next reap's poll. 0 or -EIO. */
int trellis_fio_send(struct trellis_fio_dev *d, char *err, size_t err_len);
/* Poll once; up to max (cookie, result) pairs, result 0 or NVMe SCT<<8|SC. Count or -EIO. */
int trellis_fio_reap(struct trellis_fio_dev *d, uint64_t *cookies, int32_t *results, uint32_t max,
		     char *err, size_t err_len);
/* Wait for in-flight I/O, disconnect, free. 0 or -EIO. */
int trellis_fio_close(struct trellis_fio_dev *d, char *err, size_t err_len);

#endif
