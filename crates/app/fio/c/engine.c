/*
 * fio ioengine "trellis": fio jobs over the Trellis user-space NVMe/TCP host
 * library (docs/fio.md). Built against the headers of the fio that loads it
 * (scripts/build-fio-engine.sh) and linked with libtrellis_fio.a, which does
 * all the NVMe/TCP work; this file only maps fio's ioengine_ops onto it.
 *
 *   ioengine=external:/path/to/trellis-fio.so
 *   filename=traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2026-11.io.trellis\:default ns=1
 *
 * One file per job (one controller connection and one I/O queue pair per
 * job, owned by the job's thread or process). Completions are busy-polled,
 * like SPDK's plugin: a job keeps its CPU busy while I/O is in flight.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fio.h"
#include "trellis_fio.h"

#define ERR_LEN 256

struct tfio_job {
	struct trellis_fio_dev *dev;
	unsigned int depth;
	struct io_u **events; /* io_us reaped by getevents, handed out by event */
	uint64_t *cookies;
	int32_t *results;
	int reported; /* NVMe error statuses already logged (a few, not thousands) */
};

static struct tfio_job *job_of(struct thread_data *td)
{
	return td->io_ops_data;
}

static int tfio_get_file_size(struct thread_data *td, struct fio_file *f)
{
	char err[ERR_LEN] = "";
	uint64_t size = 0;
	uint32_t block = 0;

	if (fio_file_size_known(f))
		return 0;
	if (trellis_fio_probe(f->file_name, &size, &block, err, sizeof(err))) {
		log_err("trellis: %s: %s\n", f->file_name, err);
		return 1;
	}
	f->real_file_size = size;
	f->filetype = FIO_TYPE_BLOCK;
	fio_file_set_size_known(f);
	return 0;
}

static int tfio_init(struct thread_data *td)
{
	struct tfio_job *j;

	if (td->o.nr_files != 1) {
		log_err("trellis: a job drives one namespace (nrfiles=1, one filename); got %u\n",
			td->o.nr_files);
		return 1;
	}
	j = calloc(1, sizeof(*j));
	if (!j)
		return 1;
	j->depth = td->o.iodepth ? td->o.iodepth : 1;
	j->events = calloc(j->depth, sizeof(*j->events));
	j->cookies = calloc(j->depth, sizeof(*j->cookies));
	j->results = calloc(j->depth, sizeof(*j->results));
	if (!j->events || !j->cookies || !j->results) {
		free(j->events);
		free(j->cookies);
		free(j->results);
		free(j);
		return 1;
	}
	td->io_ops_data = j;
	return 0;
}

static void tfio_cleanup(struct thread_data *td)
{
	struct tfio_job *j = job_of(td);

	if (!j)
		return;
	free(j->events);
	free(j->cookies);
	free(j->results);
	free(j);
	td->io_ops_data = NULL;
}

static int tfio_open_file(struct thread_data *td, struct fio_file *f)
{
	struct tfio_job *j = job_of(td);
	char err[ERR_LEN] = "";
	unsigned long long bs = td->o.max_bs[DDIR_READ];

	if (td->o.max_bs[DDIR_WRITE] > bs)
		bs = td->o.max_bs[DDIR_WRITE];
	if (bs == 0 || bs > UINT32_MAX) {
		log_err("trellis: block size %llu out of range\n", bs);
		return 1;
	}
	j->dev = trellis_fio_open(f->file_name, j->depth, (uint32_t)bs, err, sizeof(err));
	if (!j->dev) {
		log_err("trellis: %s: %s\n", f->file_name, err);
		return 1;
	}
	return 0;
}

static int tfio_close_file(struct thread_data *td, struct fio_file *f)
{
	struct tfio_job *j = job_of(td);
	char err[ERR_LEN] = "";
	int r;

	if (!j || !j->dev)
		return 0;
	r = trellis_fio_close(j->dev, err, sizeof(err));
	j->dev = NULL;
	if (r) {
		log_err("trellis: %s: close: %s\n", f->file_name, err);
		return 1;
	}
	return 0;
}

static enum fio_q_status tfio_queue(struct thread_data *td, struct io_u *io_u)
{
	struct tfio_job *j = job_of(td);
	char err[ERR_LEN] = "";
	int kind, r;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
		kind = TRELLIS_FIO_READ;
		break;
	case DDIR_WRITE:
		kind = TRELLIS_FIO_WRITE;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
		kind = TRELLIS_FIO_FLUSH;
		break;
	default:
		io_u->error = EOPNOTSUPP;
		return FIO_Q_COMPLETED;
	}
	r = trellis_fio_submit(j->dev, kind, io_u->offset, io_u->xfer_buflen, io_u->xfer_buf,
			       (uint64_t)(uintptr_t)io_u, err, sizeof(err));
	if (r == 0)
		return FIO_Q_QUEUED;
	if (r == 1)
		return FIO_Q_BUSY;
	log_err("trellis: %s\n", err);
	io_u->error = -r;
	return FIO_Q_COMPLETED;
}

static int tfio_commit(struct thread_data *td)
{
	struct tfio_job *j = job_of(td);
	char err[ERR_LEN] = "";

	if (trellis_fio_send(j->dev, err, sizeof(err))) {
		log_err("trellis: %s\n", err);
		return -EIO;
	}
	return 0;
}

static long long elapsed_ns(const struct timespec *from)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - from->tv_sec) * 1000000000LL + (now.tv_nsec - from->tv_nsec);
}

static int tfio_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			  const struct timespec *t)
{
	struct tfio_job *j = job_of(td);
	char err[ERR_LEN] = "";
	struct timespec start;
	long long limit_ns = t ? t->tv_sec * 1000000000LL + t->tv_nsec : -1;
	unsigned int got = 0;

	if (max > j->depth)
		max = j->depth;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		int i, n = trellis_fio_reap(j->dev, j->cookies, j->results, max - got, err,
					    sizeof(err));

		if (n < 0) {
			log_err("trellis: %s\n", err);
			return n;
		}
		for (i = 0; i < n; i++) {
			struct io_u *io_u = (struct io_u *)(uintptr_t)j->cookies[i];

			io_u->error = 0;
			if (j->results[i]) {
				/* NVMe status SCT<<8|SC: fio reports EIO, we say which status. */
				if (j->reported++ < 8)
					log_err("trellis: I/O at offset %llu failed with NVMe status 0x%x\n",
						(unsigned long long)io_u->offset, j->results[i]);
				io_u->error = EIO;
			}
			j->events[got++] = io_u;
		}
		if (got >= min || got >= max)
			break;
		if (limit_ns >= 0 && elapsed_ns(&start) >= limit_ns)
			break;
	}
	return got;
}

static struct io_u *tfio_event(struct thread_data *td, int event)
{
	return job_of(td)->events[event];
}

struct ioengine_ops ioengine = {
	.name = "trellis",
	.version = FIO_IOOPS_VERSION,
	/* FIO_DISKLESSIO: fio does not open, stat or extend the "file" itself;
	 * FIO_NODISKUTIL: there is no block device to sample. */
	.flags = FIO_RAWIO | FIO_DISKLESSIO | FIO_NOEXTEND | FIO_NODISKUTIL,
	.init = tfio_init,
	.queue = tfio_queue,
	.commit = tfio_commit,
	.getevents = tfio_getevents,
	.event = tfio_event,
	.cleanup = tfio_cleanup,
	.open_file = tfio_open_file,
	.close_file = tfio_close_file,
	.get_file_size = tfio_get_file_size,
};
