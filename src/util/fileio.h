/* fileio.h: small file helpers shared by the config reader and the CLI. */
#ifndef DSV4_FILEIO_H
#define DSV4_FILEIO_H

#include "dsv4cp.h"

/* Reads a whole text file (NUL-terminated, caller frees). Errors name the path. */
dsv4_status dsv4_read_text_file(const char *path, char **out);

#endif
