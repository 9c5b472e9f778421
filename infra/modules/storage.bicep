// Storage account for the Functions host (AzureWebJobsStorage), the Flex Consumption deployment
// package and the approval gate's heartbeat store. Identity-only: Flex Consumption supports managed-identity host storage
// and deployment storage, so shared keys are turned off.

@description('Azure region.')
param location string

@description('Name of the storage account (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param name string

@description('Blob container that holds the Flex Consumption deployment package.')
param deploymentContainerName string

@description('Blob container where the approval gate keeps the last Heartbeat of each forwarder.')
param heartbeatContainerName string

@description('Blob container where lb-pools keeps one blob per backend pool: its lock (a blob lease) and its held events.')
param poolStateContainerName string

@description('Blob container of the Event Grid ingestion\'s per-event records (agentless mode); its blobs are deleted this many days after their last change.')
param eventGridStateContainerName string = 'sebridge-eventgrid-state'

@description('Days after its last change an Event Grid record is deleted (an event lives minutes to days; a record must outlive Event Grid\'s 24 h of redeliveries).')
@minValue(2)
param eventGridStateRetentionDays int = 30

@description('Table where the history workflow keeps every event\'s entries and summary (HISTORY_TABLE_URL defaults to it).')
param historyTableName string = 'sebridgehistory'

@description('Redundancy of the storage account.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
param skuName string = 'Standard_LRS'

@description('Tags for every resource.')
param tags object = {}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  //checkov:skip=CKV_AZURE_35:Flex Consumption without VNet integration reaches host storage over its public endpoint (the host is not a trusted service); shared keys are off, so access needs an Entra grant.
  //checkov:skip=CKV_AZURE_59:Same as CKV_AZURE_35; add VNet integration and a private endpoint to close it (docs/deploy.md).
  //checkov:skip=CKV_AZURE_206:Holds only re-creatable host state (blob leases, the deployment package); pick a redundant SKU with the skuName parameter.
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource heartbeatContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: heartbeatContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource poolStateContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: poolStateContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

// The history's table (functions/adapters/history_table.py); the app deletes events past
// HISTORY_RETENTION_DAYS itself (tables have no lifecycle rules).
resource historyTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: historyTableName
}

// The Event Grid ingestion keeps one small record per scheduled event and never deletes it
// (a late redelivery must still find it): this rule does, once the event is long over.
resource lifecycle 'Microsoft.Storage/storageAccounts/managementPolicies@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    policy: {
      rules: [
        {
          name: 'expire-eventgrid-records'
          enabled: true
          type: 'Lifecycle'
          definition: {
            filters: {
              blobTypes: [
                'blockBlob'
              ]
              prefixMatch: [
                '${eventGridStateContainerName}/'
              ]
            }
            actions: {
              baseBlob: {
                delete: {
                  daysAfterModificationGreaterThan: eventGridStateRetentionDays
                }
              }
            }
          }
        }
      ]
    }
  }
}

@description('Name of the storage account.')
output name string = storage.name

@description('URL of the heartbeat container (HEARTBEAT_STORE_URL).')
output heartbeatContainerUrl string = '${storage.properties.primaryEndpoints.blob}${heartbeatContainer.name}'

@description('Name of the history table.')
output historyTableName string = historyTable.name

@description('URL of the deployment container.')
output deploymentContainerUrl string = '${storage.properties.primaryEndpoints.blob}${deploymentContainer.name}'
