package compactor.local;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.Random;
import org.apache.iceberg.LocationProviders;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.TableMetadataParser;
import org.apache.iceberg.TableOperations;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.LocationProvider;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;

/** HadoopTables-style metadata: metadata/vN.metadata.json and metadata/version-hint.text. */
public final class LocalTableOperations implements TableOperations {
  private final String location;
  private final FileIO io = new LocalFileIO();
  private final Random snapshotIds;
  private TableMetadata current;
  private int version = 0;

  /** A table at {@code location}, its snapshot ids drawn from {@code snapshotIds}. */
  public LocalTableOperations(String location, Random snapshotIds) {
    this.location = location;
    this.snapshotIds = snapshotIds;
  }

  @Override
  public TableMetadata current() {
    return current;
  }

  @Override
  public TableMetadata refresh() {
    return current;
  }

  @Override
  public void commit(TableMetadata base, TableMetadata metadata) {
    if (base != current) {
      throw new CommitFailedException("stale base metadata");
    }
    if (base == metadata) {
      return;
    }
    String path = metadataFileLocation("v" + (version + 1) + ".metadata.json");
    TableMetadataParser.write(metadata, io.newOutputFile(path));
    OutputFile hint = io.newOutputFile(metadataFileLocation("version-hint.text"));
    try (PositionOutputStream stream = hint.createOrOverwrite()) {
      stream.write(Integer.toString(version + 1).getBytes(StandardCharsets.UTF_8));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    version++;
    current = TableMetadataParser.read(io, path);
  }

  @Override
  public FileIO io() {
    return io;
  }

  @Override
  public String metadataFileLocation(String fileName) {
    return location + "/metadata/" + fileName;
  }

  @Override
  public LocationProvider locationProvider() {
    return LocationProviders.locationsFor(current.location(), current.properties());
  }

  @Override
  public long newSnapshotId() {
    return snapshotIds.nextLong() & Long.MAX_VALUE;
  }
}
