/* dsv4cp_mpi.h: the MPI transport of dsv4cp's communicator (kept out of dsv4cp.h so that code
 * using only one rank does not need mpi.h). */
#ifndef DSV4CP_MPI_H
#define DSV4CP_MPI_H

#include <mpi.h>
#include "dsv4cp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Wraps a duplicate of comm (so library messages never match the caller's). Collective. */
DSV4_API dsv4_status dsv4_comm_create_mpi(dsv4_comm **out, MPI_Comm comm);

#ifdef __cplusplus
}
#endif
#endif
